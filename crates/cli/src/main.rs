//! `relaycc`: topology views, routing plans, simulations in nccl-tests format, benchmarks and
//! placement advice.
//!
//! Exit status: 0 on success, 2 for usage errors (what clap refuses, and arguments a command
//! cannot honour), 1 for any other error; either way one line on stderr. A closed pipe
//! (`relaycc ... | head`) counts as success.

mod advise_cmd;
mod args;
mod bench_checks;
mod bench_cmd;
mod bench_cuda;
mod bench_driver;
mod bench_launch;
mod bench_mpi;
mod bench_ranks;
mod bench_reference;
mod bench_report;
#[cfg(feature = "cuda")]
mod calibrate_cmd;
mod plan_cmd;
mod plot;
mod progress;
mod report;
mod resources;
mod route_cmd;
mod simulate_cmd;
mod size;
mod sizing;
mod topo_cmd;
mod validate_cmd;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command, Reported, UsageError, error_line, print_error};

/// Clap's error as one line: its message lines joined, without the `error:` prefix, the usage
/// block and the pointer to `--help`.
fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut parts = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if !line.is_empty() {
            parts.push(line.strip_prefix("error: ").unwrap_or(line));
        }
    }
    parts.join(" ")
}

fn main() -> ExitCode {
    args::mark_start();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e)
            if e.use_stderr()
                && e.kind() != clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            print_error(&one_line(&e));
            return ExitCode::from(2);
        }
        // --help and --version: clap prints them on stdout and exits 0.
        Err(e) => e.exit(),
    };
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
        Command::Validate(args) => {
            validate_cmd::run(args).map(|s| out.extend_from_slice(s.as_bytes()))
        }
        #[cfg(feature = "cuda")]
        Command::Calibrate(args) => calibrate_cmd::run(args, &mut out),
        #[cfg(not(feature = "cuda"))]
        Command::Calibrate(_) => Err(anyhow::anyhow!("calibrate: {}", bench_cuda::NO_CUDA)),
    };
    match result {
        Ok(()) => {
            let mut stdout = std::io::stdout().lock();
            match stdout.write_all(&out).and_then(|()| stdout.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    print_error(&format!("cannot write output: {e}"));
                    ExitCode::from(1)
                }
            }
        }
        Err(e) if e.downcast_ref::<Reported>().is_some() => ExitCode::from(1),
        Err(e) => {
            print_error(&error_line(&e));
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
