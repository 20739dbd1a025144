//! stub
use super::Ctx;
use crate::error::Result;
use crate::plan::Plan;
use crate::request::Request;
use relaycc_topo::Topology;
/// stub
pub fn all_reduce(topo: &Topology, req: &Request, ctx: &Ctx) -> Result<Plan> {
    super::direct::plan(topo, req, ctx)
}
