//! Aligned text tables for `list` and `demo`.

/// How a column is aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// Makes `s` safe to print in one table cell: control characters (a lock name may contain
/// newlines or escape sequences) are shown escaped.
pub fn cell(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Renders `rows` under `headers`, columns separated by two spaces, trailing spaces trimmed.
pub fn render(headers: &[&str], align: &[Align], rows: &[Vec<String>]) -> String {
    let n = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, c) in row.iter().enumerate().take(n) {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows.iter()) {
        let mut line = String::new();
        for (i, w) in widths.iter().enumerate() {
            let c = row.get(i).map(String::as_str).unwrap_or("");
            let pad = w.saturating_sub(c.chars().count());
            if i > 0 {
                line.push_str("  ");
            }
            if align.get(i) == Some(&Align::Right) {
                line.push_str(&" ".repeat(pad));
                line.push_str(c);
            } else {
                line.push_str(c);
                line.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns() {
        let t = render(
            &["NAME", "N"],
            &[Align::Left, Align::Right],
            &[
                vec!["a".into(), "10".into()],
                vec!["long".into(), "2".into()],
            ],
        );
        assert_eq!(t, "NAME   N\na     10\nlong   2\n");
        assert_eq!(cell("a\nb"), "a\\nb");
    }
}
