//! Byte sizes as nccl-tests and people write them: `4096`, `4K`, `4KiB`, `64M`, `1GiB`, `1.5G`.
//! Suffixes are binary (K = KiB = 1024), as in nccl-tests.

/// Parse a size in bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u64 = match unit.trim_end_matches('b').trim_end_matches('i') {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => {
            return Err(format!(
                "size {s:?}: unknown unit {unit:?} (use B, K, KiB, M, MiB, G, GiB)"
            ));
        }
    };
    if num.is_empty() {
        return Err(format!("size {s:?} has no number"));
    }
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| format!("size {s:?} is too large"));
    }
    let f: f64 = num
        .parse()
        .map_err(|_| format!("size {s:?} is not a number"))?;
    let bytes = f * mult as f64;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64) {
        return Err(format!("size {s:?} is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// A size for people: `256 MiB`, `4 KiB`, `1000 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, v) in UNITS {
        if bytes >= v && bytes % v == 0 {
            return format!("{} {name}", bytes / v);
        }
    }
    for (name, v) in UNITS {
        if bytes >= v {
            return format!("{:.2} {name}", bytes as f64 / v as f64);
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
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("64mb"), Ok(64 << 20));
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(format_size(256 << 20), "256 MiB");
        assert_eq!(format_size(1000), "1000 B");
    }
}
