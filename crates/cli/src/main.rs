//! `relaycc`: topology views, routing plans, simulations in nccl-tests format, benchmarks and
//! placement advice.
//!
//! Exit status: 0 on success, 2 for usage errors (clap), 1 for any other error, reported as one
//! line on stderr. A closed pipe (`relaycc ... | head`) counts as success.

mod advise_cmd;
mod args;
mod bench_cmd;
mod calibrate_cmd;
mod plan_cmd;
mod plot;
mod report;
mod route_cmd;
mod simulate_cmd;
mod size;
mod topo_cmd;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = Vec::new();
    let result = match &cli.command {
        Command::Topo(cmd) => topo_cmd::run(cmd, &mut out),
        Command::Bench(args) => bench_cmd::run(args, &mut out),
        Command::Route(args) => route_cmd::run(args).map(|s| out.extend_from_slice(s.as_bytes())),
        Command::Plan(args) => plan_cmd::run(args).map(|s| out.extend_from_slice(s.as_bytes())),
        Command::Simulate(args) => {
            simulate_cmd::run(args).map(|s| out.extend_from_slice(s.as_bytes()))
        }
        Command::Advise(args) => advise_cmd::run(args).map(|s| out.extend_from_slice(s.as_bytes())),
        Command::Calibrate(args) => calibrate_cmd::run(args, &mut out),
    };
    match result {
        Ok(()) => {
            let mut stdout = std::io::stdout().lock();
            match stdout.write_all(&out).and_then(|()| stdout.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("relaycc: cannot write output: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Err(e) => {
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("relaycc: {}", chain.join(": "));
            ExitCode::from(1)
        }
    }
}
