"""The `attention` pass lives in `attention_match.py`; the pass manager imports this name."""

from minicomp.passes.attention_match import attention_pass, match_attention  # noqa: F401 (registers)
