//! Byte sizes as nccl-tests and people write them: `4096`, `4K`, `4KiB`, `64M`, `1.5G`, `1GB`.
//!
//! A bare letter or a binary unit is a power of 1024 (`K` = `Ki` = `KiB` = 1024, as nccl-tests
//! reads `-b 4K`); a decimal unit with `B` is a power of 1000 (`kB`/`KB` = 1000, `MB`, `GB`,
//! `TB`). Letters are case-insensitive. A fraction is accepted when it names a whole number of
//! bytes (`1.5K` = 1536); anything after the unit, a fraction of a byte, or a size past
//! `u64::MAX` is refused.

/// Parse a size in bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult = unit_bytes(unit.trim()).ok_or_else(|| {
        format!(
            "size {s:?}: unknown unit {unit:?} (use B, K/KiB, M/MiB, G/GiB, T/TiB for powers \
             of 1024, kB, MB, GB, TB for powers of 1000)"
        )
    })?;
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    if whole.is_empty() && frac.is_empty() {
        return Err(format!("size {s:?} has no number"));
    }
    if frac.contains('.') || frac.len() > 18 {
        return Err(format!("size {s:?} is not a number"));
    }
    let digits = |d: &str| -> Result<u128, String> {
        if d.is_empty() {
            return Ok(0);
        }
        d.parse::<u128>()
            .map_err(|_| format!("size {s:?} is too large"))
    };
    // Exact arithmetic: (whole + frac / 10^k) * mult must be a whole number of bytes.
    let scale = 10u128.pow(frac.len() as u32);
    let scaled = digits(whole)?
        .checked_mul(scale)
        .and_then(|w| w.checked_add(digits(frac).ok()?))
        .and_then(|v| v.checked_mul(u128::from(mult)))
        .ok_or_else(|| format!("size {s:?} is too large"))?;
    if scaled % scale != 0 {
        return Err(format!("size {s:?} is not a whole number of bytes"));
    }
    u64::try_from(scaled / scale).map_err(|_| format!("size {s:?} is too large"))
}

/// Bytes per unit, or `None` for an unknown unit.
fn unit_bytes(unit: &str) -> Option<u64> {
    let u = unit.to_ascii_lowercase();
    let power = |p: char| "kmgt".find(p).map(|i| i as u32 + 1);
    match u.as_bytes() {
        [] | [b'b'] => Some(1),
        [p] | [p, b'i'] | [p, b'i', b'b'] => power(*p as char).map(|e| 1024u64.pow(e)),
        [p, b'b'] => power(*p as char).map(|e| 1000u64.pow(e)),
        _ => None,
    }
}

/// A size for people, in the largest binary unit it reaches: `256 MiB`, `1.50 GiB`, `1000 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, v) in UNITS {
        if bytes >= v {
            return if bytes.is_multiple_of(v) {
                format!("{} {name}", bytes / v)
            } else {
                format!("{:.2} {name}", bytes as f64 / v as f64)
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("256Mi"), Ok(256 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size(".5K"), Ok(512));
        assert_eq!(parse_size("7B"), Ok(7));
        assert_eq!(format_size(256 << 20), "256 MiB");
        assert_eq!(format_size(1000), "1000 B");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
    }

    #[test]
    fn decimal_units_are_powers_of_1000() {
        assert_eq!(parse_size("1kB"), Ok(1000));
        assert_eq!(parse_size("64MB"), Ok(64_000_000));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("1.5TB"), Ok(1_500_000_000_000));
    }

    #[test]
    fn junk_fractions_of_bytes_and_overflow_are_refused() {
        for bad in [
            "256MiBB",
            "12XB",
            "MiB",
            "",
            ".",
            "1.5",
            "0.1K",
            "1..5K",
            "1e3",
            "-4K",
            "4 K B",
            "99999999999T",
            "18446744073709551616",
            "16EiB",
            "1.5.5",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
    }
}
