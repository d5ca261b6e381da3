//! Calendar arithmetic for the few places chpart reads a date: UTC only, proleptic Gregorian,
//! no time zones (those are the server's, see `LoadSpec::server_timezone`).

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days in `month` (1-12) of `year`; `None` for a month that does not exist.
pub fn days_in_month(year: i64, month: i64) -> Option<i64> {
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => Some(31),
        4 | 6 | 9 | 11 => Some(30),
        2 if leap => Some(29),
        2 => Some(28),
        _ => None,
    }
}

/// `YYYY-MM-DD` (midnight) or `YYYY-MM-DDTHH:MM:SSZ`, UTC, years 1970-9999, as milliseconds
/// since the epoch; `None` for anything else.
pub fn parse_utc_ms(text: &str) -> Option<i64> {
    let (date, time) = match text.split_once('T') {
        Some((date, time)) => (date, Some(time.strip_suffix('Z')?)),
        None => (text, None),
    };
    let numbers = |s: &str, sep: char, widths: [usize; 3]| -> Option<[i64; 3]> {
        let parts: Vec<&str> = s.split(sep).collect();
        if parts.len() != 3 {
            return None;
        }
        let mut out = [0; 3];
        for ((part, width), slot) in parts.iter().zip(widths).zip(&mut out) {
            if part.len() != width || !part.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            *slot = part.parse().ok()?;
        }
        Some(out)
    };
    let [year, month, day] = numbers(date, '-', [4, 2, 2])?;
    if year < 1970 || !(1..=days_in_month(year, month)?).contains(&day) {
        return None;
    }
    let seconds = match time {
        Some(time) => {
            let [h, m, s] = numbers(time, ':', [2, 2, 2])?;
            if h > 23 || m > 59 || s > 59 {
                return None;
            }
            h * 3600 + m * 60 + s
        }
        None => 0,
    };
    Some((days_from_civil(year, month, day) * 86_400 + seconds) * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times_parse_to_epoch_milliseconds() {
        let rows: &[(&str, Option<i64>)] = &[
            ("1970-01-01", Some(0)),
            ("2026-01-01", Some(1_767_225_600_000)),
            ("2024-02-29T23:59:59Z", Some(1_709_251_199_000)),
            ("2026-12-01T09:00:00Z", Some(1_796_115_600_000)),
            ("2000-03-01", Some(951_868_800_000)),
            ("2025-02-29", None),
            ("1900-02-29", None),
            ("2026-13-01", None),
            ("2026-01-01T25:00:00Z", None),
            ("2026-01-01T09:00:00", None),
            ("2026-1-01", None),
            ("2026-01-01x", None),
            ("1969-12-31", None),
            ("", None),
        ];
        for (text, want) in rows {
            assert_eq!(parse_utc_ms(text), *want, "{text}");
        }
        assert_eq!(days_in_month(2100, 2), Some(28));
        assert_eq!(days_in_month(2000, 2), Some(29));
    }
}
