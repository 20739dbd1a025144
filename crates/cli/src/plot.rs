//! Bandwidth-vs-size plots (SVG, plotters), like the figures of [Ranganath-2019] and
//! [Temucin-2021].

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

/// One size's busbw figures, GB/s.
pub struct BusbwPoint {
    /// The size, bytes.
    pub bytes: u64,
    /// relaycc's.
    pub relaycc: f64,
    /// The baseline's.
    pub baseline: f64,
    /// The bound's.
    pub bound: f64,
}

/// Write busbw against size for relaycc, the baseline and the bound.
pub fn write_svg(path: &Path, rows: &[BusbwPoint], title: &str) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
    let xmin = rows.iter().map(|r| r.bytes.max(1)).min().unwrap_or(1) as f64;
    let xmax = rows.iter().map(|r| r.bytes.max(1)).max().unwrap_or(2) as f64;
    let ymax = rows
        .iter()
        .map(|r| r.bound.max(r.relaycc))
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d((xmin..xmax.max(xmin * 2.0)).log_scale(), 0.0..ymax)
        .map_err(|e| anyhow!("plot: {e}"))?;
    chart
        .configure_mesh()
        .x_desc("size (bytes)")
        .y_desc("busbw (GB/s)")
        .draw()
        .map_err(|e| anyhow!("plot: {e}"))?;
    type Series = (&'static str, RGBColor, fn(&BusbwPoint) -> f64);
    let series: [Series; 3] = [
        ("relaycc", RGBColor(211, 47, 47), |r| r.relaycc),
        ("NCCL-like baseline", RGBColor(25, 118, 210), |r| r.baseline),
        ("bound", RGBColor(120, 120, 120), |r| r.bound),
    ];
    for (name, color, f) in series {
        chart
            .draw_series(LineSeries::new(
                rows.iter().map(|r| (r.bytes.max(1) as f64, f(r))),
                color.stroke_width(2),
            ))
            .map_err(|e| anyhow!("plot: {e}"))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| anyhow!("plot: {e}"))?;
    root.present()
        .map_err(|e| anyhow!("plot {}: {e}", path.display()))?;
    Ok(())
}
