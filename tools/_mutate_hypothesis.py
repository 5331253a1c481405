"""pytest plugin for tools/mutate.py: Hypothesis finds, but does not shrink.

A mutant only needs one failing example; shrinking it to the smallest can
take minutes (long stateful runs) and would turn a kill into a timeout.  No
example database either: what one mutant's run finds must not be replayed
against the next (each result depends on its mutant alone).  The seed is
fixed on the command line (``--hypothesis-seed``).
"""

from __future__ import annotations

from hypothesis import Phase, settings

settings.register_profile(
    "mutate", phases=[Phase.explicit, Phase.reuse, Phase.generate], database=None, print_blob=False
)
settings.load_profile("mutate")
