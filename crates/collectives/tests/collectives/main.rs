//! Integration tests of relaycc-collectives.
//!
//! - `props`: every collective, in place and out of place, over random presets, masks, GPU
//!   subsets, sizes, element types and ops, against a naive reference;
//! - `bad_inputs`: one test per class of bad argument, each checking nothing changed;
//! - `bad_shapes`: random argument shapes never panic and an error changes nothing;
//! - `topology_files`: real topology files from `crates/topo/tests/data` end to end;
//! - `host_scale`: host ranks at scale (a bounded pool of lane threads, a few threads
//!   driving a thousand per-rank handles).

mod common;

mod bad_inputs;
mod bad_shapes;
mod budget;
mod host_scale;
mod plan_cache;
mod props;
mod topology_files;
