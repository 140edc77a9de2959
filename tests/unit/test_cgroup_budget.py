"""CFS budgets of physical hosts (``lab.cgroups.cfs_budget``): the kernel refuses a quota under
1 ms (EINVAL) and a period over 1 s, so budgets under 0.1 core get a longer period."""
import pytest

from lab.cgroups import cfs_budget
from lab.errors import LabError


@pytest.mark.parametrize("cores, quota, period", [
    (0.25, 2_500, 10_000), (1.5, 15_000, 10_000), (0.1, 1_000, 10_000),
    (0.05, 1_000, 20_000), (0.003, 1_000, 333_334), (0.001, 1_000, 1_000_000)])
def test_quota_and_period_keep_the_budget_within_the_kernel_limits(cores, quota, period):
    q, p = cfs_budget(cores)
    assert (q, p) == (quota, period)
    assert q / p == pytest.approx(cores, rel=1e-3)


@pytest.mark.parametrize("cores", [0.0009, 0.0, -1.0])
def test_a_budget_cfs_cannot_enforce_is_a_clear_error(cores):
    with pytest.raises(LabError, match="cpu_cores"):
        cfs_budget(cores)
