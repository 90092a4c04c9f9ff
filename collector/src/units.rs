//! Units in text: bytes, durations, rates, device names. Used by every layer (detectors word their
//! messages, the report and the live line print numbers), so it imports nothing of the crate.

/// "1.50 GiB", "512 B".
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

/// A size as people write it: `4GiB`, `512 MiB`, `2g`, `64KiB`, `1073741824` (a whole number
/// with an optional binary unit, any case: B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB; a KB is
/// 1024 bytes, as `nvidia-smi` and PyTorch count). The error names the text and an example.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let bad = || format!("{text:?} is not a size (expected e.g. 4GiB, 512MiB)");
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text} is out of range"))
}

/// "1 allocation", "2 allocations", "0 allocations": a count with its noun, singular for one.
pub fn fmt_count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// "250 ms", "3.20 s", "4 min 12 s".
pub fn fmt_duration(secs: f64) -> String {
    if secs < 1.0 {
        format!("{:.0} ms", secs * 1000.0)
    } else if secs < 120.0 {
        format!("{secs:.2} s")
    } else {
        format!("{:.0} min {:.0} s", (secs / 60.0).floor(), secs % 60.0)
    }
}

/// "+1.00 MiB/step (2.10 MiB/s)".
pub fn fmt_rate(per_step: f64, per_s: Option<f64>) -> String {
    let sign = if per_step < 0.0 { "-" } else { "+" };
    let step = fmt_bytes(per_step.abs() as u64);
    match per_s {
        Some(s) if s.is_finite() => format!("{sign}{step}/step ({}/s)", fmt_bytes(s.abs() as u64)),
        _ => format!("{sign}{step}/step"),
    }
}

/// A device as the text names it: `device N`, or `host (pinned)` for the host's pinned memory
/// (a device below 0).
pub fn device_name(d: i16) -> String {
    if d < 0 {
        "host (pinned)".into()
    } else {
        format!("device {d}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_human() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
        assert_eq!(fmt_bytes(3 << 30), "3.00 GiB");
    }

    #[test]
    fn counts_agree_with_their_noun() {
        assert_eq!(fmt_count(1, "allocation"), "1 allocation");
        assert_eq!(fmt_count(0, "step"), "0 steps");
        assert_eq!(fmt_count(2, "free"), "2 frees");
    }

    #[test]
    fn rates_have_a_sign() {
        assert_eq!(
            fmt_rate(1048576.0, Some(2.0 * 1048576.0)),
            "+1.00 MiB/step (2.00 MiB/s)"
        );
        assert_eq!(fmt_rate(-1024.0, None), "-1.00 KiB/step");
    }

    #[test]
    fn sizes_parse_as_people_write_them() {
        assert_eq!(parse_bytes("4GiB"), Ok(4 << 30));
        assert_eq!(parse_bytes(" 512 MiB "), Ok(512 << 20));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
        assert_eq!(parse_bytes("64KiB"), Ok(64 << 10));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("1TiB"), Ok(1 << 40));
        for bad in ["", "GiB", "-1GiB", "1.5GiB", "4 parsecs"] {
            assert!(
                parse_bytes(bad).unwrap_err().contains("is not a size"),
                "{bad}"
            );
        }
        assert!(parse_bytes("99999999999TiB")
            .unwrap_err()
            .contains("out of range"));
    }
}
