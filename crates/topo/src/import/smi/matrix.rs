//! Reading the text of `nvidia-smi topo -m` into a checked matrix: the header, one row per
//! device, the affinity cells, the trailing legends.

use std::collections::BTreeMap;

use crate::classify::PathClass;
use crate::error::{Result, TopoError};

/// Most device columns a matrix may have. The tree reconstruction is cubic in this; real
/// machines print a few dozen at most, so this only stops junk from costing minutes.
pub(super) const MAX_DEVICES: usize = 256;

/// One device column (and its row).
#[derive(Debug, Clone)]
pub(super) struct Device {
    /// The label in the header and at the start of its row (`GPU0`, `mlx5_1`, `NIC3`).
    pub label: String,
    /// The GPU index for `GPU<i>` columns, None for NICs.
    pub gpu: Option<u32>,
    /// The NIC's name: the NIC Legend's name for `NIC<j>`, else the label. Empty for GPUs.
    pub nic_name: String,
    /// The 1-based line of the device's row.
    pub line: usize,
    /// The row's CPU Affinity cell, when it holds a CPU list.
    pub cpu_affinity: Option<String>,
    /// The row's NUMA Affinity cell, when it holds one NUMA id.
    pub numa: Option<u32>,
}

/// A matrix that passed the format's own checks: square, X exactly on the diagonal, symmetric,
/// NV# only between GPUs.
#[derive(Debug, Clone)]
pub(super) struct Matrix {
    /// Devices in column order.
    pub devices: Vec<Device>,
    /// `cells[a][b]`: how device a reaches device b (SOC already read as SYS).
    pub cells: Vec<Vec<PathClass>>,
}

/// The extra columns after the device columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExtraColumn {
    /// `CPU Affinity`: a CPU list such as `0-19,40-59`.
    CpuAffinity,
    /// `NUMA Affinity`: the NUMA node of the device's host memory.
    NumaAffinity,
    /// `GPU NUMA ID`: the NUMA node of the GPU's own memory (Grace Hopper); not modelled.
    GpuNumaId,
}

/// The extra column labels, as words separated by any run of blanks.
const EXTRA_LABELS: [(&[&str], ExtraColumn); 3] = [
    (&["CPU", "Affinity"], ExtraColumn::CpuAffinity),
    (&["NUMA", "Affinity"], ExtraColumn::NumaAffinity),
    (&["GPU", "NUMA", "ID"], ExtraColumn::GpuNumaId),
];

/// A header label.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Label {
    Device(String),
    Extra(ExtraColumn),
}

/// The lines of the input: BOM and CR stripped, numbered from 1. An iterator, not a vector:
/// an index entry per line would take 24 bytes for every 1-byte blank line of the input.
fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.trim_start_matches('\u{feff}')
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .enumerate()
        .map(|(i, l)| (i + 1, l))
}

/// Read and check the matrix.
pub(super) fn read(text: &str, source_name: &str) -> Result<Matrix> {
    let err = |line: usize, message: String| TopoError::parse(source_name, line, message);
    let mut it = lines(text).filter(|(_, l)| !l.trim().is_empty());
    let Some((header_line, header)) = it.next() else {
        return Err(err(0, "empty input: no nvidia-smi topo -m matrix".into()));
    };
    let (mut devices, extras) = read_header(header).map_err(|m| err(header_line, m))?;
    let n = devices.len();
    let mut cells: Vec<Vec<PathClass>> = Vec::with_capacity(n);
    let mut last_line = header_line;
    for row in 0..n {
        let Some((line, text)) = it.next() else {
            return Err(err(
                last_line,
                format!(
                    "input ends after {row} of {n} matrix rows; the row of {} is missing",
                    devices[row].label
                ),
            ));
        };
        last_line = line;
        let (row_cells, trailing) = read_row(text, row, &devices).map_err(|m| err(line, m))?;
        let dev = &mut devices[row];
        dev.line = line;
        read_extras(dev, &extras, &trailing).map_err(|m| err(line, m))?;
        cells.push(row_cells);
    }
    read_trailer(&mut it, &mut devices).map_err(|(line, m)| err(line, m))?;
    check_cells(&devices, &cells).map_err(|(line, m)| err(line, m))?;
    Ok(Matrix { devices, cells })
}

/// Match an extra column label at the start of `s`; returns it and its length in bytes.
fn match_extra(s: &str) -> Option<(ExtraColumn, usize)> {
    'labels: for (words, col) in EXTRA_LABELS {
        let mut pos = 0;
        for (k, w) in words.iter().enumerate() {
            if k > 0 {
                let blanks = s[pos..].len() - s[pos..].trim_start().len();
                if blanks == 0 {
                    continue 'labels;
                }
                pos += blanks;
            }
            if !s[pos..].starts_with(w) {
                continue 'labels;
            }
            pos += w.len();
        }
        return Some((col, pos));
    }
    None
}

/// True when `s` starts with `prefix` followed by an ASCII digit.
fn prefix_then_digit(s: &str, prefix: &str) -> bool {
    s.strip_prefix(prefix)
        .and_then(|r| r.bytes().next())
        .is_some_and(|c| c.is_ascii_digit())
}

/// True when `s` starts like a NIC device name: letters, then letters or digits, `_`, a digit
/// (`mlx5_0`, `hfi1_0`).
fn nic_like(s: &str) -> bool {
    let b = s.as_bytes();
    if !b.first().is_some_and(|c| c.is_ascii_alphabetic()) {
        return false;
    }
    let Some(us) = b.iter().position(|c| !c.is_ascii_alphanumeric()) else {
        return false;
    };
    b[us] == b'_' && b.get(us + 1).is_some_and(|c| c.is_ascii_digit())
}

/// Where a label that starts `run` ends. Narrow columns glue labels together (`GPU0GPU1`,
/// `mlx5_0mlx5_1CPU Affinity`), so a label also ends where its digits stop and the next
/// recognised label begins: `GPU<n>`, `NIC<n>`, an extra column, a NIC-like name, or the same
/// stem again. `rest` is the whole remaining header, because an extra label spans blanks.
fn label_end(rest: &str, run_len: usize) -> usize {
    let b = rest.as_bytes();
    // Start of the digit run that ends the label so far; the stem is what precedes it.
    let mut digits_start = 0;
    for i in 1..run_len {
        if b[i].is_ascii_digit() && !b[i - 1].is_ascii_digit() {
            digits_start = i;
        }
        if !b[i - 1].is_ascii_digit() || b[i].is_ascii_digit() {
            continue;
        }
        let next = &rest[i..];
        let stem = &rest[..digits_start];
        if match_extra(next).is_some()
            || prefix_then_digit(next, "GPU")
            || prefix_then_digit(next, "NIC")
            || nic_like(next)
            || (!stem.is_empty() && prefix_then_digit(next, stem))
        {
            return i;
        }
    }
    run_len
}

/// Split the header into labels.
fn header_labels(header: &str) -> Vec<Label> {
    let mut labels = Vec::new();
    let mut rest = header.trim_start();
    while !rest.is_empty() {
        if let Some((col, len)) = match_extra(rest) {
            labels.push(Label::Extra(col));
            rest = rest[len..].trim_start();
            continue;
        }
        let run_len = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
        let end = label_end(rest, run_len);
        labels.push(Label::Device(rest[..end].to_string()));
        rest = rest[end..].trim_start();
    }
    labels
}

/// `GPU<n>` as a GPU index: Some(Ok(n)), Some(Err) when the number does not fit, None for
/// other labels.
fn gpu_id(label: &str) -> Option<std::result::Result<u32, String>> {
    let digits = label.strip_prefix("GPU")?;
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some(
        digits
            .parse::<u32>()
            .map_err(|_| format!("GPU id {label} is out of range")),
    )
}

/// Read the header: the device columns in order and the extra columns after them.
fn read_header(header: &str) -> std::result::Result<(Vec<Device>, Vec<ExtraColumn>), String> {
    let mut devices: Vec<Device> = Vec::new();
    let mut extras = Vec::new();
    for label in header_labels(header) {
        match label {
            Label::Extra(col) => extras.push(col),
            Label::Device(label) => {
                if !extras.is_empty() {
                    return Err(format!(
                        "device column {label} comes after the affinity columns"
                    ));
                }
                if PathClass::parse(&label).is_some() {
                    return Err(format!(
                        "`{label}` is a matrix cell, not a column label: the header line is missing"
                    ));
                }
                if devices.iter().any(|d| d.label == label) {
                    return Err(format!("column {label} appears twice in the header"));
                }
                if devices.len() == MAX_DEVICES {
                    return Err(format!("more than {MAX_DEVICES} device columns"));
                }
                let gpu = gpu_id(&label).transpose()?;
                devices.push(Device {
                    nic_name: if gpu.is_some() {
                        String::new()
                    } else {
                        label.clone()
                    },
                    label,
                    gpu,
                    line: 0,
                    cpu_affinity: None,
                    numa: None,
                });
            }
        }
    }
    let gpus = devices.iter().filter(|d| d.gpu.is_some()).count() as u32;
    if gpus == 0 {
        return Err("the header has no GPU column (expected labels GPU0, GPU1, ...)".into());
    }
    let mut seen = vec![false; gpus as usize];
    for d in &devices {
        if let Some(i) = d.gpu {
            let slot = seen.get_mut(i as usize).ok_or_else(|| {
                format!(
                    "{} is out of range: the header has {gpus} GPU columns (GPU0..GPU{})",
                    d.label,
                    gpus - 1
                )
            })?;
            if std::mem::replace(slot, true) {
                return Err(format!("GPU {i} has two columns"));
            }
        }
    }
    Ok((devices, extras))
}

/// Read row `row`: its label must be that of column `row`, then one cell per column. Returns the
/// cells and the trailing (extra column) cells.
fn read_row(
    text: &str,
    row: usize,
    devices: &[Device],
) -> std::result::Result<(Vec<PathClass>, Vec<String>), String> {
    let want = &devices[row].label;
    let text = text.trim_start();
    let label_len = text.find(char::is_whitespace).unwrap_or(text.len());
    let label = &text[..label_len];
    let mut rest = &text[label_len..];
    if label != want {
        // A label as wide as its column can run into the first cell (`mlx5_10X`).
        let glued = label
            .strip_prefix(want.as_str())
            .filter(|c| PathClass::parse(c).is_some());
        match glued {
            Some(_) => rest = &text[want.len()..],
            None => return Err(row_label_error(label, row, devices)),
        }
    }
    let n = devices.len();
    let mut cells = Vec::with_capacity(n);
    for (col, column) in devices.iter().enumerate() {
        let start = rest.len() - rest.trim_start().len();
        let after = &rest[start..];
        let len = after.find(char::is_whitespace).unwrap_or(after.len());
        if len == 0 {
            return Err(format!(
                "row {want} is truncated: it has {col} of {n} cells (column {} is missing)",
                column.label
            ));
        }
        let cell = &after[..len];
        let class = PathClass::parse(cell).ok_or_else(|| {
            format!(
                "unknown cell `{}` in row {want}, column {} (expected X, NV#, PIX, PXB, PHB, NODE, SYS or SOC)",
                cell.escape_debug(),
                column.label
            )
        })?;
        cells.push(class);
        rest = &after[len..];
    }
    Ok((cells, trailing_cells(rest)))
}

/// Why a row label is not the expected one.
fn row_label_error(label: &str, row: usize, devices: &[Device]) -> String {
    let want = &devices[row].label;
    let position = devices.iter().position(|d| d.label == label);
    let label = label.escape_debug();
    match position {
        Some(i) if i < row => format!(
            "duplicate row {label} (its row is on line {}); expected the row of {want}",
            devices[i].line
        ),
        Some(_) => format!(
            "row {label} is out of order: rows must follow the header's columns, expected the row of {want}"
        ),
        None => format!("row label `{label}` matches no column; expected the row of {want}"),
    }
}

/// The cells after the matrix cells. Tab-separated output keeps empty cells between tabs (`0\t\tN/A`),
/// so tabs split exactly; space-aligned output cannot show empty cells, so blanks split.
fn trailing_cells(rest: &str) -> Vec<String> {
    let rest = rest.trim_start_matches(' ');
    if rest.contains('\t') {
        let rest = rest.strip_prefix('\t').unwrap_or(rest);
        if rest.trim().is_empty() {
            return Vec::new();
        }
        rest.split('\t').map(|c| c.trim().to_string()).collect()
    } else {
        rest.split_whitespace().map(str::to_string).collect()
    }
}

/// True for a CPU list such as `0-19,40-59`.
fn is_cpu_list(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_digit() || c == b'-' || c == b',')
        && s.bytes().next().is_some_and(|c| c.is_ascii_digit())
}

/// Check the trailing cells and store the affinities they give. Cells map to the header's extra
/// columns by position; extra cells beyond them must still look like affinity values, and a
/// cell that reads as a matrix cell means the row is longer than the header.
fn read_extras(
    dev: &mut Device,
    extras: &[ExtraColumn],
    trailing: &[String],
) -> std::result::Result<(), String> {
    for (k, cell) in trailing.iter().enumerate() {
        if PathClass::parse(cell).is_some() {
            return Err(format!(
                "row {} has more cells than the header has device columns (extra `{cell}`)",
                dev.label
            ));
        }
        let blank = cell.is_empty() || cell == "N/A";
        let column = extras.get(k).copied();
        match column {
            Some(ExtraColumn::CpuAffinity) if !blank => {
                if !is_cpu_list(cell) {
                    return Err(format!(
                        "CPU Affinity `{}` of {} is not a CPU list",
                        cell.escape_debug(),
                        dev.label
                    ));
                }
                dev.cpu_affinity = Some(cell.clone());
            }
            Some(ExtraColumn::NumaAffinity) if !blank => {
                // Some drivers print a range (`0-1`) when several nodes are equally close; only a
                // single id names the socket.
                if !is_cpu_list(cell) {
                    return Err(format!(
                        "NUMA Affinity `{}` of {} is not a NUMA id",
                        cell.escape_debug(),
                        dev.label
                    ));
                }
                dev.numa = cell.parse().ok();
            }
            _ if blank || is_cpu_list(cell) => {}
            _ => {
                return Err(format!(
                    "unexpected cell `{}` after the matrix in row {}",
                    cell.escape_debug(),
                    dev.label
                ));
            }
        }
    }
    Ok(())
}

/// Read what follows the matrix: legend text (ignored), the NIC Legend (`NIC0: mlx5_0`), and
/// nothing that looks like another row.
fn read_trailer<'a>(
    lines: &mut impl Iterator<Item = (usize, &'a str)>,
    devices: &mut [Device],
) -> std::result::Result<(), (usize, String)> {
    let mut in_nic_legend = false;
    let mut named: BTreeMap<usize, usize> = BTreeMap::new();
    for (line, text) in lines {
        let text = text.trim();
        let first = text.split_whitespace().next().unwrap_or("");
        if text == "NIC Legend:" {
            in_nic_legend = true;
            continue;
        }
        // Entries count even without their heading, so a legend cut off above still names NICs.
        let entry = text
            .split_once(':')
            .is_some_and(|(l, _)| prefix_then_digit(l.trim(), "NIC"));
        if in_nic_legend || entry {
            let (label, name) = text
                .split_once(':')
                .map(|(l, n)| (l.trim(), n.trim()))
                .filter(|(l, n)| {
                    prefix_then_digit(l, "NIC") && !n.is_empty() && !n.contains(char::is_whitespace)
                })
                .ok_or_else(|| {
                    (
                        line,
                        format!(
                            "expected `NIC<n>: <name>` in the NIC Legend, found `{}`",
                            text.escape_debug()
                        ),
                    )
                })?;
            let col = devices
                .iter()
                .position(|d| d.label == label)
                .ok_or_else(|| {
                    (
                        line,
                        format!("the NIC Legend names {label} but the matrix has no such column"),
                    )
                })?;
            if gpu_id(name).is_some() {
                return Err((line, format!("NIC {label} cannot be named {name}")));
            }
            if let Some(prev) = named.insert(col, line) {
                return Err((
                    line,
                    format!("the NIC Legend names {label} twice (also on line {prev})"),
                ));
            }
            devices[col].nic_name = name.to_string();
            continue;
        }
        if let Some(d) = devices.iter().find(|d| d.label == first) {
            return Err((
                line,
                format!(
                    "duplicate row {first} after the matrix (its row is on line {})",
                    d.line
                ),
            ));
        }
        if gpu_id(first).is_some() || prefix_then_digit(first, "NIC") {
            return Err((
                line,
                format!("row {first} after the matrix has no column in the header"),
            ));
        }
    }
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for d in devices.iter().filter(|d| d.gpu.is_none()) {
        if let Some(prev) = names.insert(&d.nic_name, d.line) {
            return Err((
                d.line,
                format!(
                    "two NICs are named {} (rows on lines {prev} and {})",
                    d.nic_name, d.line
                ),
            ));
        }
    }
    Ok(())
}

/// The format's own rules: X exactly on the diagonal, symmetry (SOC and SYS are the same
/// class), NV# only between GPUs.
fn check_cells(
    devices: &[Device],
    cells: &[Vec<PathClass>],
) -> std::result::Result<(), (usize, String)> {
    for (a, da) in devices.iter().enumerate() {
        for (b, db) in devices.iter().enumerate() {
            let c = cells[a][b];
            let at = |m: String| (da.line, m);
            if a == b && c != PathClass::SameDevice {
                return Err(at(format!(
                    "cell ({0}, {0}) is {c}; the diagonal must be X",
                    da.label
                )));
            }
            if a != b && c == PathClass::SameDevice {
                return Err(at(format!(
                    "cell ({}, {}) is X off the diagonal",
                    da.label, db.label
                )));
            }
            if let PathClass::NvLink(_) = c
                && (da.gpu.is_none() || db.gpu.is_none())
            {
                return Err(at(format!(
                    "cell ({}, {}) is {c}, but NVLink joins only GPUs",
                    da.label, db.label
                )));
            }
            if b < a && cells[b][a] != c {
                return Err(at(format!(
                    "the matrix is not symmetric: cell ({}, {}) is {c} but ({}, {}) on line {} is {}",
                    da.label, db.label, db.label, da.label, db.line, cells[b][a]
                )));
            }
        }
    }
    Ok(())
}
