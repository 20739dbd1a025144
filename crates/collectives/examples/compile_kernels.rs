//! Compiles relaycc's CUDA kernels to PTX with NVRTC, through the same function the library
//! uses (`relaycc_collectives::cuda::compile_ptx`), and writes one file per architecture plus
//! the list of expected entry points. `scripts/check-kernels` runs it, then assembles the PTX
//! with ptxas; the output directory also works as `RELAYCC_PTX_DIR`.
//!
//! ```text
//! cargo run -p relaycc-collectives --example compile_kernels -- --arch 70 --arch 80 --arch 90 --out DIR
//! ```
//!
//! Needs NVRTC (not a GPU): set `RELAYCC_NVRTC_LIB` to libnvrtc.so.12 or its directory when it
//! is not on the loader's path. Exit status 0 when every architecture compiled with every entry
//! point present, 1 on a compile or entry-point failure, 2 on bad arguments.

use std::path::PathBuf;
use std::process::ExitCode;

use relaycc_collectives::cuda::{
    Arch, compile_ptx, expected_entries, nvrtc, ptx_entries, ptx_file_name,
};

const USAGE: &str =
    "usage: compile_kernels --arch N [--arch N ...] --out DIR   (N: 70, sm_80, compute_90, 9.0)";

fn parse_args() -> Result<(Vec<Arch>, PathBuf), String> {
    let mut archs = Vec::new();
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--arch" => {
                let value = args.next().ok_or("--arch needs a value")?;
                for one in value.split(',') {
                    archs.push(one.parse::<Arch>()?);
                }
            }
            "--out" => out = Some(PathBuf::from(args.next().ok_or("--out needs a directory")?)),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if archs.is_empty() {
        archs.extend(Arch::CHECKED);
    }
    let out = out.ok_or("--out DIR is required")?;
    Ok((archs, out))
}

fn main() -> ExitCode {
    let (archs, out) = match parse_args() {
        Ok(parsed) => parsed,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("compile_kernels: {message}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&archs, &out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("compile_kernels: {message}");
            ExitCode::from(1)
        }
    }
}

fn run(archs: &[Arch], out: &std::path::Path) -> Result<(), String> {
    let info = nvrtc().map_err(|e| e.to_string())?;
    let from = info
        .preloaded_from
        .as_ref()
        .map(|p| format!(" from {}", p.display()))
        .unwrap_or_default();
    eprintln!(
        "compile_kernels: nvrtc {}.{} ({}{from})",
        info.version.0, info.version.1, info.library
    );
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let expected: Vec<&str> = expected_entries().collect();
    let list = out.join("entries.txt");
    std::fs::write(&list, expected.join("\n") + "\n")
        .map_err(|e| format!("{}: {e}", list.display()))?;
    for &arch in archs {
        let started = std::time::Instant::now();
        // compile_ptx already fails when an expected entry point is missing.
        let ptx = compile_ptx(arch).map_err(|e| e.to_string())?;
        let path = out.join(ptx_file_name(arch));
        std::fs::write(&path, &ptx).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!(
            "compile_kernels: {} -> {} ({} entry points, {} bytes, {:.2}s)",
            arch.compute_name(),
            path.display(),
            ptx_entries(&ptx).len(),
            ptx.len(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
