//! # relaycc-route: plans, simulation, routing (being built; see issue 3)

#![deny(missing_docs)]
