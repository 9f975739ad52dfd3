"""schemathesis against a real cao-server: no 5xx, and no answer its OpenAPI schema doesn't describe.

The server runs on a private tmux socket with a token, so the checks also see that routes refuse
requests without it. Each operation gets ``MAX_EXAMPLES`` schema-valid and ``MAX_EXAMPLES``
schema-breaking requests, derandomized so that a failure reproduces; the run stays in the normal
suite. (schemathesis' own pytest loader doesn't run under pytest 9 yet, so the operations are
driven through Hypothesis directly, one ``@given`` per operation and mode.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

from tests.helpers import ServerProcess

TOKEN = "fuzz-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_EXAMPLES = 50


# every operation of the schema in one test (42 of them, about 3 s each on a 2-core machine):
# past the suite's 120 s per-test default once the board's and coordination's routes came (a limit
# firing mid-run reads as a flaky route: "inconsistent data generation")
@pytest.mark.timeout(900)
def test_cao_server_matches_its_schema_and_never_fails(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    # the server runs outside any git repository: a fuzzed use_worktree=true must not make
    # worktrees and branches of this one (it gets a 422 instead)
    (tmp_path / "server-cwd").mkdir()
    srv = make_server(CAO_API_TOKEN=TOKEN, cwd=tmp_path / "server-cwd")
    # positive_data_acceptance wants 2xx for every schema-valid value; cao answers 422 for values no
    # schema can tell apart (an unknown provider, a directory that doesn't exist), so it is left out.
    # A schema-breaking request is rejected with schemathesis' usual statuses, or 413 when it breaks
    # the schema by being too large (cao refuses any body over 1 MiB before reading it).
    rejected = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
    config = SchemathesisConfig.from_dict(
        {
            "headers": AUTH,
            "checks": {
                "positive_data_acceptance": {"enabled": False},
                "negative_data_rejection": {"expected-statuses": rejected},
            },
        }
    )
    schema = schemathesis.openapi.from_url(f"{srv.url}/openapi.json", config=config, headers=AUTH)
    schema.config.update(base_url=srv.url)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20, [op.label for op in operations]
    failures: list[str] = []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def check(case: schemathesis.Case) -> None:
                case.call_and_validate(headers=AUTH)

            try:
                check()
            except Unsatisfiable:  # nothing in the schema to break (no parameters, any string goes)
                assert mode is GenerationMode.NEGATIVE, operation.label
            except (Exception, BaseExceptionGroup) as exc:  # collect all: one run shows every failure
                failures.append(f"{operation.label} ({mode.value}): {exc}")
    assert not failures, "\n\n".join(failures)
