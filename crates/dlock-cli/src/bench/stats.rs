//! Summary statistics of the bench: latency percentiles, the Jain fairness index, clocks.

use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A latency distribution in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Lat {
    /// Number of samples.
    pub n: usize,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Largest sample.
    pub max_us: f64,
    /// Arithmetic mean.
    pub mean_us: f64,
}

impl Lat {
    /// Summarises `samples` (microseconds); all zero when empty.
    pub fn of(samples: &[f64]) -> Lat {
        if samples.is_empty() {
            return Lat::default();
        }
        let mut s = samples.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| {
            // Nearest rank.
            let rank = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len());
            s[rank - 1]
        };
        Lat {
            n: s.len(),
            p50_us: q(0.50),
            p99_us: q(0.99),
            max_us: s[s.len() - 1],
            mean_us: s.iter().sum::<f64>() / s.len() as f64,
        }
    }
}

/// Jain's fairness index of `xs`: (Σx)² / (n·Σx²), 1 = perfectly even, 1/n = one takes all.
pub fn jain(xs: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if n == 0.0 || sq == 0.0 {
        return 0.0;
    }
    sum * sum / (n * sq)
}

/// Nanoseconds since the Unix epoch (CLOCK_REALTIME: comparable across processes of a machine).
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A duration in microseconds as a float.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Formats microseconds for a table: `412 µs`, `3.41 ms`, `1.20 s`.
pub fn fmt_us(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} s", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.1} ms", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.2} ms", v / 1e3)
    } else {
        format!("{v:.0} µs")
    }
}

/// Formats a byte count: `312 B`, `4.1 KiB`, `12.3 MiB`.
pub fn fmt_bytes(v: f64) -> String {
    let a = v.abs();
    if a >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", v / 1024.0 / 1024.0)
    } else if a >= 10.0 * 1024.0 {
        format!("{:.1} KiB", v / 1024.0)
    } else {
        format!("{v:.0} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_jain() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        let l = Lat::of(&xs);
        assert_eq!(l.n, 100);
        assert_eq!(l.p50_us, 50.0);
        assert_eq!(l.p99_us, 99.0);
        assert_eq!(l.max_us, 100.0);
        assert!((l.mean_us - 50.5).abs() < 1e-9);
        assert_eq!(Lat::of(&[]).n, 0);
        assert!((jain(&[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert_eq!(fmt_us(412.0), "412 µs");
        assert_eq!(fmt_us(3410.0), "3.41 ms");
        assert_eq!(fmt_bytes(312.0), "312 B");
    }
}
