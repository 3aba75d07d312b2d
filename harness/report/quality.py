"""The report's quality guard: which configs' outputs are too far from the reference to be chosen.

A config fails the guard when its median ``quality.token_agreement`` with the engine's
default config is below ``min_agreement`` (default 0.99: MLPerf accepts a faster
submission only within 1% of the reference's accuracy), or, for structured workloads, its
median ``quality.parsed_rate`` is below ``min_parse_rate`` (off by default). A config whose
agreement was never measured (run without ``quality.reference``) is not checked, and
says so. Failing configs are never the chosen or the runner-up config of a decision; the
decision names the faster configs it passed over and by how much.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# report column -> row column; medians over a config's ok rows (harness.report.data)
COLUMNS = {"agreement": "quality.token_agreement", "identical_rate": "quality.identical_rate",
           "parsed_rate": "quality.parsed_rate", "valid_rate": "quality.valid_rate",
           "truncated_rate": "quality.truncated_rate", "exact_match": "quality.exact_match"}


@dataclass(frozen=True)
class QualityGuard:
    min_agreement: float | None = 0.99
    min_parse_rate: float | None = None

    def failing(self, config: dict[str, Any]) -> str | None:
        """Why ``config`` (a ``group_configs`` record) fails the guard, or ``None``."""
        reasons = []
        for column, floor, name in (("agreement", self.min_agreement, "token agreement with the default config"),
                                    ("parsed_rate", self.min_parse_rate, "parse rate")):
            value = config.get(column)
            if floor is not None and _measured(value) and value < floor:
                reasons.append(f"{name} {value:.3f} < {floor:g}")
        return "; ".join(reasons) or None


def _measured(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))
