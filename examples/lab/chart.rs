//! SVG charts with plotters: admitted per second over time, and the limit.
//!
//! SVG keeps the lab free of font files and native libraries; browsers and
//! GitHub render the text.

use std::path::Path;

use plotters::prelude::*;

/// One line of a chart.
pub struct Line<'a> {
    pub label: String,
    pub per_sec: &'a [u64],
    pub color: RGBColor,
}

/// Draws `lines` (one point per second, at its middle) against a dashed `limit` line (units per second) into `path`.
pub fn draw(path: &Path, title: &str, lines: &[Line<'_>], limit: f64) -> Result<(), String> {
    let secs = lines
        .iter()
        .map(|l| l.per_sec.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let top = lines
        .iter()
        .flat_map(|l| l.per_sec.iter().copied())
        .max()
        .unwrap_or(0) as f64;
    let top = (top.max(limit) * 1.15).ceil().max(1.0);

    let root = SVGBackend::new(path, (1000, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..secs as f64, 0f64..top)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("simulated time, s")
        .y_desc("requests per second")
        .light_line_style(WHITE.mix(0.0))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;

    // The limit first, dashed, so that a strategy sitting on it stays visible.
    let red = RGBColor(220, 30, 30);
    chart
        .draw_series(DashedLineSeries::new(
            [(0.0, limit), (secs as f64, limit)],
            10,
            6,
            red.stroke_width(2),
        ))
        .map_err(|e| e.to_string())?
        .label(format!("limit ({limit:.0}/s)"))
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], red.stroke_width(2)));
    for line in lines {
        let color = line.color;
        // Each second's count at the middle of that second.
        let points = line
            .per_sec
            .iter()
            .enumerate()
            .map(|(s, &n)| (s as f64 + 0.5, n as f64));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(line.label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// A distinct, readable color for series `i`.
pub fn color(i: usize) -> RGBColor {
    const COLORS: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(23, 190, 207),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    COLORS[i % COLORS.len()]
}
