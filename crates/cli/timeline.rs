//! Draws a load's [`Timeline`] as an SVG picture: one lane per attempt (build, upload and
//! publish as coloured segments, what became of it beside its name), then one row per ledger
//! entry worth showing (begin, plan, decision, attaches, partitions made visible, the end),
//! each with a faint line across the lanes at its time.

use chpart_protocol::timeline::{Fate, Lane, Timeline};

const WIDTH: f64 = 1100.0;
const LABELS: f64 = 360.0;
const RIGHT: f64 = 24.0;
const ROW: f64 = 22.0;
const TOP: f64 = 78.0;

const BUILD: &str = "#4e79a7";
const UPLOAD: &str = "#f28e2b";
const PUBLISH: &str = "#59a14f";

/// The picture of `timeline`, as an SVG document.
pub fn svg(timeline: &Timeline) -> String {
    let times: Vec<u64> = timeline
        .lanes
        .iter()
        .flat_map(|l| {
            let p = &l.phases;
            [p.started, p.built, p.uploaded, p.published]
        })
        .chain(timeline.marks.iter().map(|m| m.at.max(0) as u64))
        .filter(|t| *t > 0)
        .collect();
    let t0 = times.iter().copied().min().unwrap_or(0);
    let t1 = times.iter().copied().max().unwrap_or(0).max(t0 + 1000);
    let plot = WIDTH - LABELS - RIGHT;
    let x = |t: u64| LABELS + (t.saturating_sub(t0)) as f64 / (t1 - t0) as f64 * plot;
    let lanes_end = TOP + ROW * timeline.lanes.len() as f64;
    let height = lanes_end + 30.0 + ROW * timeline.marks.len() as f64 + 20.0;

    let mut out = String::new();
    out.push_str(&format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {WIDTH} {height:.0}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    ));
    out.push_str(&format!(
        "<text x=\"12\" y=\"22\" font-size=\"15\" font-weight=\"bold\">load {} into {} ({})</text>\n",
        escape(&timeline.load),
        escape(&timeline.table),
        escape(&timeline.state)
    ));
    legend(&mut out);

    // The time axis: seconds since the first time shown.
    let span = (t1 - t0) as f64 / 1e3;
    let step = nice_step(span / 8.0);
    let mut s = 0.0;
    while s <= span + 1e-9 {
        let tx = x(t0 + (s * 1e3) as u64);
        out.push_str(&format!(
            "<line x1=\"{tx:.1}\" y1=\"{:.1}\" x2=\"{tx:.1}\" y2=\"{:.1}\" stroke=\"#e4e4e4\"/>\n\
             <text x=\"{tx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#666\">+{}s</text>\n",
            TOP - 8.0,
            height - 14.0,
            TOP - 12.0,
            trim(s)
        ));
        s += step;
    }

    for (i, lane) in timeline.lanes.iter().enumerate() {
        let y = TOP + ROW * i as f64;
        lane_row(&mut out, lane, y, &x);
    }

    // The ledger's entries: a row each, a faint line across the lanes.
    out.push_str(&format!(
        "<text x=\"12\" y=\"{:.1}\" font-weight=\"bold\">ledger (server clock)</text>\n",
        lanes_end + 20.0
    ));
    for (i, mark) in timeline.marks.iter().enumerate() {
        let y = lanes_end + 30.0 + ROW * i as f64;
        let mx = x(mark.at.max(0) as u64);
        let label = match mark.shard {
            Some(n) => format!("shard {n}: {}", mark.what),
            None => mark.what.clone(),
        };
        let (anchor, lx) = if mx > WIDTH - 260.0 {
            ("end", mx - 8.0)
        } else {
            ("start", mx + 8.0)
        };
        out.push_str(&format!(
            "<line x1=\"{mx:.1}\" y1=\"{:.1}\" x2=\"{mx:.1}\" y2=\"{:.1}\" stroke=\"#9467bd\" \
             stroke-opacity=\"0.35\" stroke-dasharray=\"3,3\"/>\n\
             <circle cx=\"{mx:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"#9467bd\"/>\n\
             <text x=\"{lx:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\">{}</text>\n",
            TOP - 4.0,
            y + 11.0,
            y + 11.0,
            y + 15.0,
            escape(&label)
        ));
    }
    out.push_str("</svg>\n");
    out
}

fn lane_row(out: &mut String, lane: &Lane, y: f64, x: &dyn Fn(u64) -> f64) {
    let (fate, colour, opacity) = match lane.fate {
        Fate::Won => ("won", "#2a7d2a", 1.0),
        Fate::Lost => ("lost", "#777777", 0.45),
        Fate::NoManifest => ("no manifest", "#c0392b", 0.45),
        Fate::Collected => ("collected by gc", "#8e44ad", 0.45),
        Fate::Fenced => ("wrote late: fenced", "#d35400", 0.45),
    };
    let mut name = String::new();
    if let Some(n) = lane.shard {
        name.push_str(&format!("shard {n} · "));
    }
    if let Some(p) = lane.partition {
        name.push_str(&format!("p{p} · "));
    }
    // The tail of an attempt id tells attempts of one job apart (Spark's task attempt id).
    name.push_str(&shorten(&lane.attempt, 24));
    let weight = if lane.fate == Fate::Won {
        " font-weight=\"bold\""
    } else {
        ""
    };
    out.push_str(&format!(
        "<g><title>{}: {fate}</title>\n\
         <text x=\"12\" y=\"{:.1}\"{weight}>{}</text>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"{colour}\"{weight}>{fate}</text>\n",
        escape(&lane.attempt),
        y + 15.0,
        escape(&name),
        LABELS - 8.0,
        y + 15.0,
    ));
    let p = &lane.phases;
    let segments = [
        (p.started, p.built, BUILD),
        (p.built, p.uploaded, UPLOAD),
        (p.uploaded, p.published, PUBLISH),
    ];
    let mut drawn = false;
    for (from, to, fill) in segments {
        if from > 0 && to >= from {
            bar(out, x(from), x(to), y, fill, opacity);
            drawn = true;
        }
    }
    if !drawn && p.started > 0 && p.published >= p.started {
        // Known from start to end only (e.g. fenced): one bar in the fate's colour.
        bar(out, x(p.started), x(p.published), y, colour, opacity);
    } else if !drawn && p.published > 0 {
        // Only the last change is known: a marker there.
        let mx = x(p.published);
        out.push_str(&format!(
            "<path d=\"M{:.1} {:.1} l6 7 l-6 7 l-6 -7 z\" fill=\"{colour}\" fill-opacity=\"{opacity}\"/>\n",
            mx,
            y + 4.0
        ));
    }
    out.push_str("</g>\n");
}

/// A bar of a lane whose top is `y`, from `a` to `b` (at least 1.5 px wide).
fn bar(out: &mut String, a: f64, b: f64, y: f64, fill: &str, opacity: f64) {
    out.push_str(&format!(
        "<rect x=\"{a:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{fill}\" \
         fill-opacity=\"{opacity}\"/>\n",
        y + 4.0,
        (b - a).max(1.5),
        ROW - 8.0
    ));
}

fn legend(out: &mut String) {
    let mut lx = WIDTH - 330.0;
    for (label, fill) in [("build", BUILD), ("upload", UPLOAD), ("publish", PUBLISH)] {
        out.push_str(&format!(
            "<rect x=\"{lx:.1}\" y=\"12\" width=\"14\" height=\"12\" fill=\"{fill}\"/>\
             <text x=\"{:.1}\" y=\"22\">{label}</text>\n",
            lx + 18.0
        ));
        lx += 80.0;
    }
    out.push_str(&format!(
        "<circle cx=\"{:.1}\" cy=\"18\" r=\"4\" fill=\"#9467bd\"/><text x=\"{:.1}\" y=\"22\">ledger</text>\n",
        lx + 7.0,
        lx + 18.0
    ));
}

/// A round step for axis ticks near `raw` seconds.
fn nice_step(raw: f64) -> f64 {
    [
        0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    ]
    .into_iter()
    .find(|s| *s >= raw)
    .unwrap_or(7200.0)
}

fn trim(s: f64) -> String {
    let text = format!("{s:.1}");
    text.strip_suffix(".0").map(str::to_owned).unwrap_or(text)
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let tail: String = text
        .chars()
        .rev()
        .take(max - 1)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("…{tail}")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chpart_protocol::timeline::{Mark, PhaseTimes};

    fn lane(attempt: &str, fate: Fate, phases: [u64; 4]) -> Lane {
        Lane {
            attempt: attempt.into(),
            shard: None,
            partition: Some(0),
            phases: PhaseTimes {
                started: phases[0],
                built: phases[1],
                uploaded: phases[2],
                published: phases[3],
            },
            fate,
            parts: 1,
        }
    }

    #[test]
    fn every_attempt_and_mark_is_drawn_on_one_time_axis() {
        let t = 1_800_000_000_000;
        let timeline = Timeline {
            load: "l<1>".into(),
            table: "db.events".into(),
            state: "committed".into(),
            lanes: vec![
                lane("won-1", Fate::Won, [t, t + 1000, t + 1500, t + 2000]),
                lane("lost-1", Fate::Lost, [t + 200, t + 900, t + 1200, t + 1300]),
                lane("zombie-1", Fate::NoManifest, [0, 0, 0, t + 5000]),
            ],
            marks: vec![
                Mark {
                    at: (t + 3000) as i64,
                    shard: None,
                    what: "plan".into(),
                },
                Mark {
                    at: (t + 4000) as i64,
                    shard: Some(2),
                    what: "committed".into(),
                },
            ],
        };
        let svg = svg(&timeline);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("load l&lt;1&gt; into db.events (committed)"));
        // Three segments each for the two attempts with manifests, a marker for the zombie.
        assert_eq!(
            svg.matches(&format!("fill=\"{BUILD}\" fill-opacity"))
                .count(),
            2
        );
        assert_eq!(
            svg.matches(&format!("fill=\"{PUBLISH}\" fill-opacity"))
                .count(),
            2
        );
        assert_eq!(svg.matches("<path d=").count(), 1);
        for text in [
            "won",
            "lost",
            "no manifest",
            "plan",
            "shard 2: committed",
            "+5s",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
        // The first start is at the left of the plot, the last time at its right.
        assert!(svg.contains(&format!("<rect x=\"{LABELS:.1}\"")));
        assert!(svg.contains(&format!("<path d=\"M{:.1}", WIDTH - RIGHT)));
    }
}
