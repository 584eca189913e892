//! How often the policy and the governor re-measure the side they are not using (drafting
//! or plain decoding): each re-measuring loses something, and together they may lose at most
//! a budgeted share.

/// Periods (or rounds) between two re-measurings of the side not in use, each of which loses
/// `lost` (in the unit the budget is a share of), so that they cost at most `budget`.
pub(crate) fn within_budget(lost: f64, budget: f64, min: u64, max: u64) -> u64 {
    // Less a hair: a loss of exactly 25 budgets is 25 periods, not 26.
    let every = (lost / budget - 1e-9).ceil();
    if every.is_finite() { (every.max(0.0) as u64).clamp(min, max) } else { min }
}
