//! The fidelity table: published measurements of real machines beside what the model predicts
//! for them, so every relaycc figure can be judged by how far the model is from hardware.
//!
//! Each row ([`Row`], in [`ROWS`]) is one published figure with its bibliography key: a
//! point-to-point copy, an nccl-tests bus bandwidth or small-message time, or a figure of
//! [Ranganath-2019] or [Temucin-2021]. The prediction is the NCCL-like baseline's (what NCCL
//! does on the preset), or, for those two papers, relaycc's plan of the paper's method.
//! [`evaluate`] computes every row's error; a row passes within [`ROW_TOLERANCE`], the table within [`MEDIAN_TOLERANCE`] of
//! median error. A row the model cannot meet says why ([`Row::gap`]) instead of leaving the
//! table. `relaycc validate` prints the table, `docs/FIDELITY.md` is its markdown.
//!
//! | item | what |
//! |---|---|
//! | [`ROWS`], [`Row`], [`Measure`] | the published figures and how each is reproduced |
//! | [`evaluate`], [`evaluate_rows`], [`evaluate_on`], [`predict`] | predictions and errors |
//! | [`Table`], [`Evaluated`] | the evaluated table |

mod eval;
mod rows;
#[cfg(test)]
mod tests;

pub use eval::{
    Evaluated, MEDIAN_TOLERANCE, ROW_TOLERANCE, Table, evaluate, evaluate_on, evaluate_rows,
    predict,
};
pub use rows::{CopyMethod, Gpus, Measure, NOT_COVERED, ROWS, Row};
