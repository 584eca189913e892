//! The subset of C `strftime` chat templates use through `strftime_now` (Llama 3.2 writes
//! `strftime_now("%d %b %Y")`), on UTC time, with no date crate.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Formats the current UTC time; see [`format`].
pub fn now(pattern: &str) -> Result<String, String> {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format(i64::try_from(secs).unwrap_or(i64::MAX), pattern)
}

/// Formats `secs` since the Unix epoch (UTC). Supported: `%Y %y %m %d %e %B %b %h %A %a %H %I
/// %M %S %p %j %%`; anything else is an error rather than a guess.
pub fn format(secs: i64, pattern: &str) -> Result<String, String> {
    let days = secs.div_euclid(86_400);
    let in_day = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (in_day / 3600, in_day / 60 % 60, in_day % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let spec = chars.next().ok_or("strftime: the pattern ends with a lone %")?;
        match spec {
            'Y' => out.push_str(&year.to_string()),
            'y' => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            'm' => out.push_str(&format!("{month:02}")),
            'd' => out.push_str(&format!("{day:02}")),
            'e' => out.push_str(&format!("{day:>2}")),
            'B' => out.push_str(month_name),
            'b' | 'h' => out.push_str(&month_name[..3]),
            'A' => out.push_str(DAYS[weekday]),
            'a' => out.push_str(&DAYS[weekday][..3]),
            'H' => out.push_str(&format!("{hour:02}")),
            'I' => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            'M' => out.push_str(&format!("{minute:02}")),
            'S' => out.push_str(&format!("{second:02}")),
            'p' => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            'j' => out.push_str(&format!("{day_of_year:03}")),
            '%' => out.push('%'),
            other => return Err(format!("strftime: %{other} is not supported")),
        }
    }
    Ok(out)
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values are what Python's time.strftime(pattern, time.gmtime(secs)) writes.
    #[test]
    fn formats_as_c_strftime_in_utc() {
        assert_eq!(format(0, "%d %b %Y").unwrap(), "01 Jan 1970");
        assert_eq!(format(0, "%A %a %j %H:%M:%S %p %y").unwrap(), "Thursday Thu 001 00:00:00 AM 70");
        // 2024-07-26 13:05:09 UTC, a Friday, day 208 of a leap year.
        assert_eq!(
            format(1_721_999_109, "%d %b %Y %B %A %j %I %p %e%%").unwrap(),
            "26 Jul 2024 July Friday 208 01 PM 26%"
        );
        // 2000-02-29, a leap day in a century leap year.
        assert_eq!(format(951_782_400, "%Y-%m-%d %a").unwrap(), "2000-02-29 Tue");
        assert!(format(0, "%Q").is_err());
        assert!(format(0, "100%").is_err());
    }
}
