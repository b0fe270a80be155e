"""Conversions between padded token tensors and the per-sequence token lists that engines such as
vLLM take and return, so the text rollout keeps one batch layout whatever samples it.

Plain tensors and Python lists only: nothing here imports vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from policies.causal_lm.modeling_causal_lm import Generation


def unpad_prompts(input_ids: Tensor, attention_mask: Tensor) -> list[list[int]]:
    """The token ids of each left-padded prompt, padding dropped.

    Args:
        input_ids: ``(batch, prompt_len)`` int64.
        attention_mask: ``(batch, prompt_len)`` 0/1, 0 on the left padding.

    Returns:
        ``batch`` lists of ints, each the row's ids where the mask is 1, in order.

    Raises:
        ValueError: the shapes differ, or a row has no token.
    """
    if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(f"input_ids and attention_mask must both be (batch, prompt_len), got "
                         f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}")
    mask = attention_mask.bool().cpu()
    empty = (~mask.any(-1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"prompts {empty[:5]} have no token (attention_mask is all 0)")
    ids = input_ids.cpu()
    return [ids[row][mask[row]].tolist() for row in range(ids.shape[0])]


def generation_from_token_lists(
    token_ids: Sequence[Sequence[int]],
    log_probs: Sequence[Sequence[float]],
    max_new_tokens: int,
    pad_token_id: int,
) -> Generation:
    """Right-pad sampled responses given as lists into the :class:`Generation` layout.

    Every listed token is a response token (an engine that stops at EOS returns the EOS as the
    last id and nothing after it), so ``response_mask`` is True on the first ``len(token_ids[i])``
    columns of row ``i``.

    Args:
        token_ids: per response, the sampled ids (at most ``max_new_tokens``).
        log_probs: per response, the log-probability of each sampled id (same lengths).
        max_new_tokens: columns of the output (``text.max_response_length``).
        pad_token_id: id written after each response.

    Returns:
        :class:`Generation`: ``responses`` ``(n, max_new_tokens)`` int64, ``response_mask``
        bool, ``log_probs`` float32 (0 on padding).

    Raises:
        ValueError: the two lists differ in length (overall or for one response), or a response
            is longer than ``max_new_tokens``.
    """
    if len(token_ids) != len(log_probs):
        raise ValueError(f"got {len(token_ids)} token lists but {len(log_probs)} log-prob lists")
    n = len(token_ids)
    responses = torch.full((n, max_new_tokens), pad_token_id, dtype=torch.int64)
    response_mask = torch.zeros((n, max_new_tokens), dtype=torch.bool)
    padded_log_probs = torch.zeros((n, max_new_tokens), dtype=torch.float32)
    for row, (ids, row_log_probs) in enumerate(zip(token_ids, log_probs)):
        if len(ids) != len(row_log_probs):
            raise ValueError(f"response {row}: {len(ids)} tokens but {len(row_log_probs)} log-probs")
        if len(ids) > max_new_tokens:
            raise ValueError(f"response {row} has {len(ids)} tokens, more than max_new_tokens={max_new_tokens}")
        length = len(ids)
        responses[row, :length] = torch.tensor(ids, dtype=torch.int64)
        response_mask[row, :length] = True
        padded_log_probs[row, :length] = torch.tensor(row_log_probs, dtype=torch.float32)
    return Generation(responses, response_mask, padded_log_probs)
