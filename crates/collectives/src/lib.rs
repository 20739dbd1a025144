//! # relaycc-collectives: the safe collectives API (being built; see issue 4)

#![deny(missing_docs)]
pub mod cuda;
