//! Every class of bad input gives exit status 1 or 2 and one line on stderr naming what is
//! wrong; the resource cases (huge sizes, rank counts, endless or blocking files) finish
//! without allocating, also under a small address-space limit.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{BENCH_4K_ONCE, words};

const RELAYCC: &str = env!("CARGO_BIN_EXE_relaycc");

/// Waits for `cmd`; a run past a minute is a hang (a FIFO read, an endless file) and fails
/// the test instead of blocking the suite. Its pipes are drained meanwhile, so a command that
/// prints more than a pipe holds still ends.
fn finish(mut cmd: Command, what: &str) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the relaycc binary runs");
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                p.read_to_end(&mut bytes).expect("reading relaycc's output");
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting on relaycc") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{what}: still running after a minute");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: stdout.join().expect("the stdout reader"),
        stderr: stderr.join().expect("the stderr reader"),
    }
}

fn relaycc(args: &[&str]) -> Output {
    let mut cmd = Command::new(RELAYCC);
    cmd.args(args);
    finish(cmd, &format!("{args:?}"))
}

/// `relaycc args` under a 1 GiB address-space limit (`ulimit -v`), so a command that tried to
/// allocate a huge buffer or read an endless file fails instead of taking the machine.
fn relaycc_limited(args: &[&str]) -> Output {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -v 1048576 && exec \"$0\" \"$@\"")
        .arg(RELAYCC)
        .args(args);
    finish(cmd, &format!("{args:?} under ulimit -v"))
}

/// Asserts a refusal: exit `code`, one stderr line that starts `relaycc: ` and contains `needle`.
fn refused(o: &Output, code: i32, needle: &str, what: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{what}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err}");
    assert!(err.starts_with("relaycc: "), "{what}: {err}");
    assert!(err.contains(needle), "{what}: {needle:?} not in {err}");
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("relaycc-bad-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A thousand host ranks fit a 1 GiB address-space limit: a bounded pool of threads drives
/// the ranks and runs the lanes (a thread per rank and per lane reserved 2,048 stacks), and a
/// 1 KiB all_reduce on 1,024 ranks is a plan of 2,047 ops.
#[test]
fn a_thousand_host_ranks_run_under_a_small_address_space_limit() {
    let args = words(
        "bench all_reduce --backend host --ranks 1024 -b 1K -e 1K -n 2 -w 1 --check --format json",
    );
    let o = relaycc_limited(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("bench JSON");
    assert_eq!(v["ranks"], 1024, "{v}");
    assert_eq!(v["results"][0]["wrong"], 0, "{v}");
}

#[test]
fn malformed_sizes_are_usage_errors() {
    for (size, needle) in [
        ("256MiBB", "unknown unit"),
        ("1.5", "whole number of bytes"),
        ("0.1K", "whole number of bytes"),
        ("1e3", "unknown unit"),
        ("99999999999T", "too large"),
    ] {
        let o = relaycc(&["route", "--from", "0", "--to", "7", "--size", size]);
        refused(&o, 2, needle, size);
    }
    let o = relaycc(&["bench", "all_reduce", "--ranks", "2", "-b", "1GiBB"]);
    refused(&o, 2, "unknown unit", "bench -b 1GiBB");
}

#[test]
fn sizes_that_are_no_whole_number_of_elements_are_usage_errors() {
    let o = relaycc(&["plan", "all_reduce", "--gpus", "0,1", "--size", "3"]);
    refused(&o, 2, "not a whole number of f32 elements", "plan --size 3");
    let o = relaycc(&words("simulate all_reduce --dtype f64 -b 4 -e 64"));
    refused(&o, 2, "f64 elements", "simulate f64 -b 4");
    let o = relaycc(&["bench", "all_reduce", "--ranks", "2", "-b", "6", "-e", "6"]);
    refused(&o, 2, "f32 elements", "bench -b 6");
}

#[test]
fn rank_counts_and_size_ranges_are_usage_errors() {
    for (args, needle) in [
        (&["--ranks", "0"][..], "--ranks"),
        (&["--ranks", "4294967295"][..], "--ranks"),
        (&["--gpus", "0,10000000"][..], "--gpus"),
        (
            &["--ranks", "2", "-b", "1M", "-e", "1K"][..],
            "-b 1048576 is larger than -e 1024",
        ),
        (
            &["--ranks", "2", "-b", "1K", "-e", "4K", "-f", "1"][..],
            "-f must be at least 2",
        ),
        (
            &["--ranks", "2", "-b", "0", "-e", "4K"][..],
            "-b must be at least 1 byte",
        ),
    ] {
        let mut all = vec!["bench", "all_reduce", "--backend", "host"];
        all.extend_from_slice(args);
        refused(&relaycc_limited(&all), 2, needle, &format!("{args:?}"));
    }
    let o = relaycc(&["simulate", "all_reduce", "-b", "1M", "-e", "1K"]);
    refused(&o, 2, "larger than -e", "simulate -b > -e");
    // bench and simulate step sizes alike: one size needs no factor, a range does.
    let o = relaycc(&["simulate", "all_reduce", "-b", "1K", "-e", "4K", "-f", "1"]);
    refused(&o, 2, "-f must be at least 2", "simulate -f 1");
}

#[test]
fn relays_and_masks_that_contradict_the_job_are_errors() {
    let o = relaycc(&[
        "route", "--from", "0", "--to", "7", "--size", "1M", "--relay", "99",
    ]);
    refused(
        &o,
        1,
        "--relay: bad request: relay GPU 99 does not exist",
        "--relay 99",
    );
    let o = relaycc(&words("plan all_reduce --gpus 0,1 --size 1M --relay 3,99"));
    refused(
        &o,
        1,
        "--relay: bad request: relay GPU 99",
        "plan --relay 3,99",
    );
    let o = relaycc(&words(
        "plan all_reduce --gpus 0,1 --mask-gpus 0,1,2,3,4,5,6,7 --size 1M",
    ));
    refused(
        &o,
        2,
        "--gpus 0 is also in --mask-gpus",
        "plan on masked GPUs",
    );
    let o = relaycc(&words(
        "route --from 0 --to 7 --size 1M --relay 3 --mask-gpus 3",
    ));
    refused(
        &o,
        2,
        "--relay 3 is also in --mask-gpus",
        "relay through a masked GPU",
    );
    let o = relaycc(&["plan", "all_reduce", "--gpus", "0,9", "--size", "1M"]);
    refused(&o, 1, "--gpus: GPU 9 does not exist", "plan --gpus 0,9");
}

#[test]
fn calibration_files_with_unknown_keys_or_impossible_rates_are_errors() {
    let dir = temp_dir("cal");
    for (name, text, needle) in [
        (
            "key.json",
            r#"{"links":[{"from":"GPU0","to":"GPU1","gbps":20,"latency":1}]}"#,
            "unknown field `latency`",
        ),
        (
            "huge.json",
            r#"{"links":[{"from":"GPU0","to":"GPU1","gbps":1e300}]}"#,
            "to 900 GB/s",
        ),
        (
            "slow.json",
            r#"{"kinds":[{"kind":"pcie","gbps_per_x16":0.001}]}"#,
            "from 0.25",
        ),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let o = relaycc(&["topo", "show", "--calibration", path.to_str().unwrap()]);
        refused(&o, 1, needle, name);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_topology_files_say_so() {
    for spec in ["my-node.txt", "./nope", "no/such/dir/topo.xml"] {
        let o = relaycc(&["topo", "show", "-t", spec]);
        refused(&o, 1, "No such file", spec);
    }
    let o = relaycc(&["topo", "show", "--calibration", "missing.cal.json"]);
    refused(&o, 1, "No such file", "missing calibration");
    let o = relaycc(&["topo", "show", "-t", "no-such-machine"]);
    refused(&o, 1, "not a preset", "unknown preset");
}

#[test]
fn huge_buffers_are_refused_before_allocating() {
    for (args, needle) in [
        (
            &["--ranks", "1", "-b", "64GiB", "-e", "64GiB"][..],
            "of host memory",
        ),
        (
            &["--ranks", "1024", "-b", "1GiB", "-e", "1GiB"][..],
            "of host memory",
        ),
        (
            &["--gpus", "0,1023", "-b", "16T", "-e", "16T"][..],
            "of host memory",
        ),
    ] {
        let mut all = words("bench all_reduce --backend host -n 1 -w 0");
        all.extend_from_slice(args);
        refused(&relaycc_limited(&all), 1, needle, &format!("{args:?}"));
    }
}

#[cfg(unix)]
#[test]
fn endless_blocking_and_oversized_inputs_are_refused_without_reading() {
    let dir = temp_dir("files");
    let fifo = dir.join("topo.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo is needed");
    let big = dir.join("big.nvidia-smi-topo.txt");
    // 200 MB without writing it: a sparse file.
    std::fs::File::create(&big)
        .unwrap()
        .set_len(200_000_000)
        .unwrap();
    let (fifo, big) = (fifo.to_str().unwrap(), big.to_str().unwrap());
    for (args, needle) in [
        (
            &["topo", "show", "-t", "/dev/zero"][..],
            "not a regular file",
        ),
        (&["topo", "show", "-t", fifo][..], "not a regular file"),
        (
            &["topo", "show", "--calibration", fifo][..],
            "not a regular file",
        ),
        (
            &["topo", "show", "--calibration", "/dev/zero"][..],
            "not a regular file",
        ),
        (&["topo", "show", "-t", big][..], "larger than the 16 MiB"),
    ] {
        refused(&relaycc_limited(args), 1, needle, &format!("{args:?}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The nvidia-smi matrix has a cell per pair of devices: a rack-scale cluster's is refused
/// at once, naming the formats that stay linear in the machine.
#[test]
fn the_smi_matrix_of_a_rack_scale_cluster_is_refused() {
    let args = [
        "topo",
        "show",
        "-t",
        "cluster:16xgb200-nvl72:ib-ndr",
        "--format",
        "smi",
    ];
    refused(
        &relaycc_limited(&args),
        1,
        "at most 1024 devices",
        "smi of 1,152 GPUs",
    );
    // One host's matrix is still printed.
    let o = relaycc(&["topo", "show", "-t", "dgx-h100", "--format", "smi"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn bench_prints_na_for_unchecked_results_and_counts_when_checked() {
    let run = |check: bool| {
        let mut args = words(BENCH_4K_ONCE);
        if check {
            args.push("--check");
        }
        let o = relaycc(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let row = text
            .lines()
            .find(|l| !l.starts_with('#'))
            .expect("a result row")
            .to_owned();
        // Columns: size count type redop root time algbw busbw #wrong ...
        row.split_whitespace()
            .nth(8)
            .expect("#wrong column")
            .to_owned()
    };
    assert_eq!(run(false), "N/A");
    assert_eq!(run(true), "0");
}

#[test]
fn parser_errors_are_one_line_with_exit_two() {
    for (args, needle) in [
        (&["topo", "show", "--format", "pdf"][..], "possible values"),
        (&["bench", "all_reduce", "--rank", "3"][..], "--ranks"),
        (
            &["plan", "all_reduce", "--size", "1M", "--gpus", "0,x"][..],
            "--gpus",
        ),
        (&["route", "--from", "0"][..], "--to"),
        (
            &["bench", "all_reduce", "--dtype", "float7"][..],
            "unknown element type",
        ),
        (&["advise", "--gpus", "2"][..], "--gpus"),
    ] {
        refused(&relaycc(args), 2, needle, &format!("{args:?}"));
    }
}

/// `bench --flags` runs the host ranks' calls over the flag transport, every output checked,
/// and names it in the report; a shape that is no SLOTSxSIZE, or `--flags` on another
/// backend, is a usage error.
#[test]
fn bench_flags_run_host_ranks_over_the_flag_transport() {
    for flags in ["--flags", "--flags=2x256"] {
        let line = format!(
            "bench all_reduce --backend host --ranks 3 -b 1K -e 64K -f 8 -n 2 -w 1 --check \
             --format json {flags}"
        );
        let o = relaycc(&words(&line));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("bench JSON");
        let backend = v["backend"].as_str().unwrap_or_default();
        assert!(backend.contains("ranks over flags"), "{v}");
        for r in v["results"].as_array().expect("results") {
            assert_eq!(r["wrong"], 0, "{v}");
        }
    }
    let o = relaycc(&words("bench all_reduce --ranks 2 --flags=4"));
    refused(&o, 2, "SLOTSxSIZE", "--flags=4");
    let o = relaycc(&words("bench all_reduce --ranks 2 --flags=0x1K"));
    refused(&o, 2, "at least one slot", "--flags=0x1K");
    let o = relaycc(&words("bench all_reduce --backend mpi --ranks 2 --flags"));
    refused(&o, 2, "--flags needs --backend host", "--flags on mpi");
}
