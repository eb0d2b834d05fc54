//! `--plot`: SVG charts of the report (plotters' SVG backend; text is left to the viewer's
//! fonts, so no font library is needed).

use super::workloads::Lib;
use super::Report;
use plotters::prelude::*;
use std::path::Path;

type Res = Result<(), Box<dyn std::error::Error>>;

const DLOCK: RGBColor = RGBColor(31, 119, 180);
const FLOOR: RGBColor = RGBColor(127, 127, 127);
const PEER: RGBColor = RGBColor(255, 127, 14);
const IDEAL: RGBColor = RGBColor(44, 160, 44);

/// One bar per entry: label, value, colour.
fn bars(path: &Path, title: &str, y_desc: &str, bars: &[(String, f64, RGBColor)]) -> Res {
    if bars.is_empty() {
        return Ok(());
    }
    let width = (160 * bars.len() as u32).clamp(640, 2400);
    let root = SVGBackend::new(path, (width, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = bars.iter().map(|b| b.1).fold(0.0_f64, f64::max).max(1e-9) * 1.15;
    let n = bars.len() as u32;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d((0..n).into_segmented(), 0.0..max)?;
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(y_desc)
        .x_labels(bars.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, v, c))| {
        let i = i as u32;
        let mut r = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), *v),
            ],
            c.filled(),
        );
        r.set_margin(0, 0, 12, 12);
        r
    }))?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, v, _))| {
        Text::new(
            format!("{v:.0}"),
            (SegmentValue::CenterOf(i as u32), *v),
            ("sans-serif", 14),
        )
    }))?;
    root.present()?;
    Ok(())
}

/// S1 curves: bytes per hold against names held (log scale), one line per store.
fn s1(path: &Path, title: &str, series: &[(String, Vec<(f64, f64)>)]) -> Res {
    let pts: Vec<&(f64, f64)> = series.iter().flat_map(|s| s.1.iter()).collect();
    if pts.is_empty() {
        return Ok(());
    }
    let ymax = pts.iter().map(|p| p.1).fold(0.0_f64, f64::max).max(1.0) * 1.15;
    let ymin = pts.iter().map(|p| p.1).fold(0.0_f64, f64::min).min(0.0);
    let xmax = pts.iter().map(|p| p.0).fold(1.0_f64, f64::max) * 1.5;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d((1.0..xmax).log_scale(), ymin..ymax)?;
    chart
        .configure_mesh()
        .x_desc("names held at once")
        .y_desc("bytes per hold")
        .draw()?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Writes u1.svg, c1.svg, h1.svg, s1-client.svg and s1-store.svg into `dir`.
pub fn charts(r: &Report, dir: &Path) -> Res {
    let mut u1 = Vec::new();
    let mut c1 = Vec::new();
    let mut h1 = Vec::new();
    for t in &r.targets {
        for u in &t.u1 {
            if u.lib == Lib::Dlock {
                u1.push((format!("{} floor", t.label), u.floor.p50_us, FLOOR));
            }
            let c = if u.lib == Lib::Dlock { DLOCK } else { PEER };
            u1.push((format!("{} {}", t.label, u.lib.name()), u.lat.p50_us, c));
        }
        for c in t.c1.iter().filter(|c| c.hold_ms == 1 && c.waiters == 8) {
            if let (Lib::Dlock, Some(i)) = (c.lib, c.ideal_acq_per_s) {
                c1.push((format!("{} ideal", t.label), i, IDEAL));
            }
            let col = if c.lib == Lib::Dlock { DLOCK } else { PEER };
            c1.push((format!("{} {}", t.label, c.lib.name()), c.acq_per_s, col));
        }
        for h in &t.h1 {
            if h.lib == Lib::Dlock {
                h1.push((format!("{} 3 RTT", t.label), 3.0 * h.rtt_us, FLOOR));
            }
            let col = if h.lib == Lib::Dlock { DLOCK } else { PEER };
            h1.push((
                format!("{} {}", t.label, h.lib.name()),
                h.run.handoff_cross.p50_us,
                col,
            ));
        }
    }
    bars(
        &dir.join("u1.svg"),
        "U1: acquire + release p50 vs the raw floor",
        "µs",
        &u1,
    )?;
    bars(
        &dir.join("c1.svg"),
        "C1: acquisitions/s, 8 waiters, 1 ms hold (ideal = 1/(hold + raw floor))",
        "acquisitions/s",
        &c1,
    )?;
    bars(
        &dir.join("h1.svg"),
        "H1: cross-process hand-off p50 vs 3 raw round trips",
        "µs",
        &h1,
    )?;
    let series = |f: &dyn Fn(&super::workloads::S1Level) -> Option<f64>| {
        r.targets
            .iter()
            .filter_map(|t| {
                let s = t.s1.as_ref()?;
                let pts: Vec<(f64, f64)> = s
                    .levels
                    .iter()
                    .filter_map(|l| Some((l.held as f64, f(l)?)))
                    .collect();
                Some((t.label.clone(), pts))
            })
            .collect::<Vec<_>>()
    };
    s1(
        &dir.join("s1-client.svg"),
        "S1: client memory (RSS) per hold",
        &series(&|l| Some(l.client_bytes_per_hold)),
    )?;
    s1(
        &dir.join("s1-store.svg"),
        "S1: store memory per hold",
        &series(&|l| l.store_bytes_per_hold),
    )?;
    Ok(())
}
