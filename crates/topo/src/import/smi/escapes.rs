//! Terminal escape sequences in copied `nvidia-smi topo -m` output.
//!
//! On a terminal, nvidia-smi underlines the matrix header: `ESC[4m` before it, `ESC[0m` after.
//! Text copied from a terminal keeps those sequences, or keeps only their remnants when the
//! copy dropped the escape byte (`[4m\tGPU0\tGPU1 ...[0m`). Neither carries topology, so both
//! are removed before the matrix is read. Removal never crosses a line end, so the line
//! numbers of errors stay those of the file.

use std::borrow::Cow;

const ESC: char = '\u{1b}';

/// `text` without ANSI CSI sequences (`ESC [` parameters, intermediates, a final byte) and
/// without SGR remnants whose escape byte is lost (`[` digits and `;` then `m`).
pub(super) fn strip(text: &str) -> Cow<'_, str> {
    if !text.contains(ESC) && !text.contains('[') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find([ESC, '[']) {
        out.push_str(&rest[..pos]);
        let tail = &rest[pos..];
        let skip = if let Some(after_esc) = tail.strip_prefix(ESC) {
            // A lone ESC, or ESC followed by anything but `[`, is dropped by itself.
            1 + after_esc
                .strip_prefix('[')
                .map_or(0, |csi| 1 + csi_len(csi))
        } else {
            sgr_remnant_len(tail)
        };
        if skip == 0 {
            out.push('[');
            rest = &tail[1..];
        } else {
            rest = &tail[skip..];
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Bytes of a CSI sequence after its `ESC [`: parameter bytes `0x30..=0x3f`, intermediate bytes
/// `0x20..=0x2f`, then one final byte `0x40..=0x7e`. An unfinished sequence (a line end or the
/// end of text first) ends where its parameters end, keeping what follows.
fn csi_len(s: &str) -> usize {
    let b = s.as_bytes();
    let params = b.iter().take_while(|c| (0x30..=0x3f).contains(*c)).count();
    let inter = b[params..]
        .iter()
        .take_while(|c| (0x20..=0x2f).contains(*c))
        .count();
    match b.get(params + inter) {
        Some(c) if (0x40..=0x7e).contains(c) => params + inter + 1,
        _ => params,
    }
}

/// Bytes of an SGR remnant at the start of `s` (`[4m`, `[0m`, `[1;32m`, `[m`), 0 if none.
fn sgr_remnant_len(s: &str) -> usize {
    let b = s.as_bytes();
    let params = b[1..]
        .iter()
        .take_while(|c| c.is_ascii_digit() || **c == b';')
        .count();
    if params <= 8 && b.get(1 + params) == Some(&b'm') {
        params + 2
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::strip;

    #[test]
    fn removes_sequences_and_their_remnants() {
        assert_eq!(strip("\u{1b}[4m\tGPU0\tGPU1\u{1b}[0m\n"), "\tGPU0\tGPU1\n");
        assert_eq!(strip("[4m\tGPU0\tGPU1[0m\n"), "\tGPU0\tGPU1\n");
        assert_eq!(strip("\u{1b}[1;32mGPU0\u{1b}[m \u{1b}[K"), "GPU0 ");
        assert_eq!(strip("[m[01;31mX"), "X");
    }

    #[test]
    fn keeps_other_text_and_line_ends() {
        assert_eq!(strip("GPU0\t[x]\tSYS\n[4\n"), "GPU0\t[x]\tSYS\n[4\n");
        assert_eq!(strip("a\u{1b}[12\nb"), "a\nb");
        assert_eq!(strip("a\u{1b}"), "a");
        assert_eq!(strip("plain"), "plain");
    }
}
