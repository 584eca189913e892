//! Parsing probability lists given on the command line ("0.6,0.3,0.1").

use specd_sampling::{DenseDist, SamplingError};

use crate::cli_error::invalid;

/// Parses a comma-separated probability list for the flag `flag`, with errors that name the
/// flag, the entry and, for lists that do not sum to 1, the sum.
pub fn parse_distribution(flag: &str, text: &str) -> anyhow::Result<DenseDist> {
    let mut probs = Vec::new();
    for (i, item) in text.split(',').enumerate() {
        let item = item.trim();
        let value: f64 =
            item.parse().map_err(|_| invalid(format!("{flag}: entry {} ('{item}') is not a number", i + 1)))?;
        probs.push(value);
    }
    DenseDist::new(probs).map_err(|err| match err {
        SamplingError::InvalidProbability { index, value } => {
            invalid(format!("{flag}: entry {} is {value}; probabilities must be finite and non-negative", index + 1))
        }
        SamplingError::NotNormalised { sum, tolerance } => {
            invalid(format!("{flag} sums to {}, not 1 (tolerance {tolerance:e})", short_number(sum)))
        }
        other => invalid(format!("{flag}: {other}")),
    })
}

/// At most 9 decimals without trailing zeros: 0.8999999999999999 reads as 0.9.
fn short_number(x: f64) -> String {
    let s = format!("{x:.9}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(text: &str) -> String {
        parse_distribution("--target", text).unwrap_err().to_string()
    }

    #[test]
    fn errors_name_the_flag_the_entry_and_the_sum() {
        assert_eq!(message("0.5,0.4"), "--target sums to 0.9, not 1 (tolerance 1e-6)");
        assert_eq!(message("0.5,x"), "--target: entry 2 ('x') is not a number");
        assert_eq!(message("1.1,-0.1"), "--target: entry 2 is -0.1; probabilities must be finite and non-negative");
        assert_eq!(message("NaN,1"), "--target: entry 1 is NaN; probabilities must be finite and non-negative");
        assert_eq!(parse_distribution("--draft", " 0.25, 0.75 ").unwrap().probs(), &[0.25, 0.75]);
    }
}
