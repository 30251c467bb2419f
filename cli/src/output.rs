//! Output formats (`--output yaml|json|table`), aligned tables as kubectl prints them,
//! and ages (`5s`, `3m`, `2h`).

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::Serialize;
use std::fmt::Write as _;

/// `--output`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// YAML documents.
    Yaml,
    /// JSON (one object, or a `List` of several).
    Json,
    /// A human-readable table.
    Table,
}

/// `value` as YAML (one document, without a leading `---`).
pub fn yaml(value: &impl Serialize) -> anyhow::Result<String> {
    let mut text = serde_saphyr::to_string(value)?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

/// `value` as indented JSON, with a final newline.
pub fn json(value: &impl Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(value)? + "\n")
}

/// A table: a header row and rows, printed with columns aligned and separated by three
/// spaces, as `kubectl get` does; callers put `-` where a value is absent, so that every
/// row has every column.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles (upper case by convention).
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(ToString::to_string).collect(),
            rows: Vec::new(),
        }
    }

    /// Add a row (missing cells are empty, extra cells are dropped).
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    /// Whether no row was added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Column widths.
    fn widths(&self) -> Vec<usize> {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        widths
    }

    fn line(cells: &[String], widths: &[usize]) -> String {
        let mut line = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}   ");
            }
        }
        line.trim_end().to_string() + "\n"
    }

    /// The header line alone, padded as the rows so far would pad it.
    pub fn header_line(&self) -> String {
        Self::line(&self.header, &self.widths())
    }

    /// Row `i` alone, padded as the whole table pads it.
    pub fn row_line(&self, i: usize) -> String {
        self.rows
            .get(i)
            .map(|r| Self::line(r, &self.widths()))
            .unwrap_or_default()
    }

    /// The whole table.
    pub fn render(&self) -> String {
        let widths = self.widths();
        let mut out = Self::line(&self.header, &widths);
        for row in &self.rows {
            out.push_str(&Self::line(row, &widths));
        }
        out
    }
}

/// How long ago `then` was, as kubectl shows ages: `45s`, `12m`, `3h`, `2d`.
pub fn age(then: Timestamp, now: Timestamp) -> String {
    let elapsed = now.duration_since(then).max(SignedDuration::ZERO);
    let secs = elapsed.as_secs();
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// `value`, or `-` when absent or empty.
pub fn or_dash(value: Option<impl ToString>) -> String {
    value
        .map(|v| v.to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "-".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_like_kubectl() {
        let mut t = Table::new(&["NAME", "PHASE", "PROVIDER"]);
        t.row(vec!["llama-8b".into(), "Deploying".into(), "dynamo".into()]);
        t.row(vec!["a".into(), "-".into()]);
        assert_eq!(
            t.render(),
            "NAME       PHASE       PROVIDER\nllama-8b   Deploying   dynamo\na          -\n"
        );
        assert_eq!(t.row_line(1), "a          -\n");
    }

    #[test]
    fn ages_read_like_kubectl() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        assert_eq!(age(at("2026-01-01T11:59:15Z"), now), "45s");
        assert_eq!(age(at("2026-01-01T11:48:00Z"), now), "12m");
        assert_eq!(age(at("2026-01-01T09:00:00Z"), now), "3h");
        assert_eq!(age(at("2025-12-29T12:00:00Z"), now), "3d");
        assert_eq!(age(at("2026-01-01T12:00:05Z"), now), "0s", "clock skew");
    }
}
