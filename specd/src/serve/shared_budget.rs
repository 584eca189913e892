//! One device's KV budget shared by the two nodes one process starts (`specd up`, `specd
//! bench --embedded`). A node alone takes its fraction of the memory free once it is warm;
//! two on one device would each take it of the same free memory (1.8 times it at 0.9). So
//! the process measures once, when both are loaded and warm, and gives each node a share in
//! proportion to its KV bytes per token: both can then hold the same number of tokens, as a
//! speculative session needs of both (each node keeps the whole sequence). A fixed
//! `--kv-budget-mib`, or a draft on another device, has nothing to share.

use specd_model::{DeviceSpec, KvBudget};

/// What a node would claim alone: where it runs and its configured budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BudgetClaim {
    pub(crate) device: DeviceSpec,
    pub(crate) budget: KvBudget,
}

/// A budget two nodes share: a fraction of one device's free memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SharedBudget {
    pub(crate) device: DeviceSpec,
    pub(crate) fraction: f64,
}

/// Each node's share in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BudgetShares {
    pub(crate) target: u64,
    pub(crate) draft: u64,
}

/// The budget the two share, where both take a fraction of the free memory of one device;
/// `None` where each keeps its own. Should their fractions differ, the smaller is shared.
pub(crate) fn shared_budget(target: BudgetClaim, draft: BudgetClaim) -> Option<SharedBudget> {
    match (target.budget, draft.budget) {
        (KvBudget::FractionOfFree(t), KvBudget::FractionOfFree(d)) if target.device == draft.device => {
            Some(SharedBudget { device: target.device, fraction: t.min(d) })
        }
        _ => None,
    }
}

impl SharedBudget {
    /// The two shares of the fraction of `free_bytes`, in proportion to each node's KV bytes
    /// per token; they add up to the whole. Nodes that keep no KV (0 bytes a token, both)
    /// get half each.
    pub(crate) fn shares(
        self,
        free_bytes: u64,
        target_bytes_per_token: u64,
        draft_bytes_per_token: u64,
    ) -> BudgetShares {
        let budget = (free_bytes as f64 * self.fraction) as u64;
        let per_token = u128::from(target_bytes_per_token) + u128::from(draft_bytes_per_token);
        let target = match per_token {
            0 => budget / 2,
            // At most `budget`, so the conversion back cannot fail.
            _ => u64::try_from(u128::from(budget) * u128::from(target_bytes_per_token) / per_token).unwrap_or(budget),
        };
        BudgetShares { target, draft: budget - target }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CUDA: DeviceSpec = DeviceSpec::Cuda(0);

    fn claim(device: DeviceSpec, budget: KvBudget) -> BudgetClaim {
        BudgetClaim { device, budget }
    }

    #[test]
    fn two_fractions_of_one_device_are_one_budget() {
        let fraction = KvBudget::FractionOfFree(0.9);
        assert_eq!(
            shared_budget(claim(CUDA, fraction), claim(CUDA, fraction)),
            Some(SharedBudget { device: CUDA, fraction: 0.9 })
        );
        let cpu = claim(DeviceSpec::Cpu, fraction);
        assert_eq!(shared_budget(cpu, cpu).map(|s| s.device), Some(DeviceSpec::Cpu));
        let smaller = claim(CUDA, KvBudget::FractionOfFree(0.5));
        assert_eq!(shared_budget(claim(CUDA, fraction), smaller).map(|s| s.fraction), Some(0.5));
    }

    #[test]
    fn a_draft_on_another_device_or_a_fixed_budget_is_left_alone() {
        let fraction = KvBudget::FractionOfFree(0.9);
        assert_eq!(shared_budget(claim(CUDA, fraction), claim(DeviceSpec::Cpu, fraction)), None);
        assert_eq!(shared_budget(claim(CUDA, fraction), claim(DeviceSpec::Cuda(1), fraction)), None);
        let fixed = KvBudget::Bytes(512 << 20);
        assert_eq!(shared_budget(claim(CUDA, fixed), claim(CUDA, fixed)), None);
        assert_eq!(shared_budget(claim(CUDA, fraction), claim(CUDA, fixed)), None);
        assert_eq!(shared_budget(claim(CUDA, KvBudget::Unbounded), claim(CUDA, fraction)), None);
    }

    #[test]
    fn shares_add_up_to_the_budget_in_proportion_to_bytes_per_token() {
        let shared = SharedBudget { device: CUDA, fraction: 0.9 };
        // A 1B-shaped target (32 KiB a token in bf16) beside a demo-sized draft (2 KiB).
        let (target, draft) = (32 << 10, 2 << 10);
        let free = 80u64 << 30;
        let shares = shared.shares(free, target, draft);
        let budget = (free as f64 * 0.9) as u64;
        assert_eq!(shares.target + shares.draft, budget);
        assert_eq!(u128::from(shares.target), u128::from(budget) * 16 / 17);
        // The same number of tokens fits in each, within one token.
        assert!((shares.target / target).abs_diff(shares.draft / draft) <= 1, "{shares:?}");
        // Odd sizes still add up; equal ones split in halves; no KV at all splits in halves.
        let odd = shared.shares(1_000_003, 7, 3);
        assert_eq!(odd.target + odd.draft, (1_000_003f64 * 0.9) as u64);
        assert_eq!(shared.shares(1000, 5, 5), BudgetShares { target: 450, draft: 450 });
        assert_eq!(shared.shares(1000, 0, 0), BudgetShares { target: 450, draft: 450 });
        assert_eq!(shared.shares(u64::MAX, u64::MAX, u64::MAX).target, (u64::MAX as f64 * 0.9) as u64 / 2);
    }
}
