//! Tests of the Plan IR's modules (relaycc-plan) that need plans from the planners: the crate
//! below the planners cannot build them in its own unit tests.

mod checked;
mod rounds;
mod step_samples;
