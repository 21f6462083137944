//! Number, size and CSV field formatting.

pub(crate) fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

pub(crate) fn csv_line(fields: &[String]) -> String {
    let mut l = fields
        .iter()
        .map(|f| csv_field(f))
        .collect::<Vec<_>>()
        .join(",");
    l.push('\n');
    l
}

pub(crate) fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e6 {
        format!("{:.3}M", v / 1e6)
    } else if a >= 100.0 {
        format!("{:.0}", v)
    } else if a >= 10.0 {
        format!("{:.1}", v)
    } else if a >= 1.0 {
        format!("{:.2}", v)
    } else {
        format!("{:.3}", v)
    }
}

pub(crate) fn fmt_size(b: usize) -> String {
    if b >= 1024 && b % 1024 == 0 {
        format!("{} KiB", b / 1024)
    } else {
        format!("{b} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_escaping_and_numbers() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(fmt_num(1234567.0), "1.235M");
        assert_eq!(fmt_num(0.1234), "0.123");
        assert_eq!(fmt_num(12.34), "12.3");
        assert_eq!(fmt_size(65536), "64 KiB");
        assert_eq!(fmt_size(56), "56 B");
    }
}
