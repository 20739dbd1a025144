//! # relaycc-kernels: the CUDA kernel sources of relaycc
//!
//! The `.cu` and `.cuh` files beside this crate's manifest, embedded as text. NVRTC reads no
//! files, so relaycc-collectives compiles these strings at run time (expanding
//! `#include "NAME"` against [`SOURCES`] itself); `scripts/check-kernels` compiles and
//! assembles them for several GPU architectures without a GPU. The sources are a crate of
//! their own so that the published relaycc-collectives package carries them, while the
//! repository keeps them at the top level where CUDA tooling finds them.

#![deny(missing_docs)]

/// Every kernel file, by the name `#include` uses for it: the shared header first, then the
/// translation units.
pub const SOURCES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../common.cuh")),
    ("forward.cu", include_str!("../forward.cu")),
    ("reduce.cu", include_str!("../reduce.cu")),
];

/// The files that form the translation unit NVRTC compiles, in order (headers come in
/// through `#include`).
pub const UNITS: &[&str] = &["forward.cu", "reduce.cu"];

/// The text of the embedded file `name`, if there is one.
pub fn source(name: &str) -> Option<&'static str> {
    SOURCES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| *text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_is_embedded_and_non_empty() {
        for unit in UNITS {
            assert!(source(unit).is_some_and(|t| !t.trim().is_empty()), "{unit}");
        }
        assert!(source("common.cuh").is_some_and(|t| t.contains("#pragma once")));
        assert_eq!(source("missing.cu"), None);
    }

    #[test]
    fn units_include_only_embedded_files() {
        for (name, text) in SOURCES {
            for line in text.lines() {
                if let Some(rest) = line.trim().strip_prefix("#include ") {
                    let header = rest.trim_matches('"');
                    assert!(source(header).is_some(), "{name} includes {rest}");
                }
            }
        }
    }
}
