//! Byte counts for people: binary units out, flexible sizes in.

/// Formats bytes like PyTorch's tools (`%.1f` with 1024-based units): `16.0GiB`, `512.0B`.
pub fn format_bytes(bytes: u64) -> String {
    format_bytes_signed(bytes as i128)
}

/// Same as [`format_bytes`] for differences, with a sign for negative values.
pub fn format_bytes_signed(bytes: i128) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let sign = if bytes < 0 { "-" } else { "" };
    let mut value = bytes.unsigned_abs() as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{sign}{value:.1}{}", UNITS[unit])
}

/// Parses a size such as `20GiB`, `512MB`, `1.5e9`, `300 MiB`, `4096`.
/// Decimal units (kB, MB, GB, TB) are powers of 1000; binary ones (KiB, MiB, …) of 1024.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a size (examples: 20GiB, 512MB, 1.5e9)"))?;
    let factor: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        other => {
            return Err(format!(
                "unknown size unit `{other}` in `{text}` (use B, KB, MB, GB, KiB, MiB, GiB, TiB)"
            ))
        }
    };
    let bytes = number * factor;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{text}` is not a valid size"));
    }
    Ok(bytes.round() as u64)
}

/// `n` and the noun in the right number: "1 event", "3 events", "1 entry", "0 entries".
pub fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_memory_viz() {
        assert_eq!(format_bytes(0), "0.0B");
        assert_eq!(format_bytes(20 * 1024 * 1024), "20.0MiB");
        assert_eq!(format_bytes(17133731840), "16.0GiB");
        assert_eq!(format_bytes_signed(-1536), "-1.5KiB");
    }

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("20GiB").unwrap(), 20 * (1 << 30));
        assert_eq!(parse_size("512MB").unwrap(), 512_000_000);
        assert_eq!(parse_size("1.5e9").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("300 MiB").unwrap(), 300 << 20);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5 parsecs").is_err());
    }
}
