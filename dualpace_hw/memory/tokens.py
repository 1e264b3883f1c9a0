"""Token ids of every live request, kept by the runtime beside the core's counts.

The core schedules by counts only (prompt length, tokens generated); the executors need the
ids. A request's ids are its prompt ids followed by its generated ids. Executors read from the
store and return the ids they sampled; the caller appends them after the core's `apply`.
"""

from __future__ import annotations


class TokenStore:
    def __init__(self) -> None:
        self._ids: dict[int, list[int]] = {}
        self._prompt: dict[int, int] = {}

    def add(self, req_id: int, prompt_ids: list[int]) -> None:
        if req_id in self._ids:
            raise KeyError(f"request {req_id} is already in the token store")
        if not prompt_ids:
            raise ValueError(f"request {req_id}: empty prompt")
        self._ids[req_id] = [int(t) for t in prompt_ids]
        self._prompt[req_id] = len(prompt_ids)

    def append(self, req_id: int, token: int) -> None:
        self._ids[req_id].append(int(token))

    def extend(self, tokens: dict[int, int]) -> None:
        """Append one sampled token per request (an executor's result)."""
        for req_id, token in tokens.items():
            self._ids[req_id].append(int(token))

    def ids(self, req_id: int) -> list[int]:
        return self._ids[req_id]

    def last(self, req_id: int) -> int:
        return self._ids[req_id][-1]

    def prompt_len(self, req_id: int) -> int:
        return self._prompt[req_id]

    def generated(self, req_id: int) -> list[int]:
        return self._ids[req_id][self._prompt[req_id]:]

    def remove(self, req_id: int) -> None:
        """Forget a finished request."""
        self._ids.pop(req_id, None)
        self._prompt.pop(req_id, None)

    def __contains__(self, req_id: int) -> bool:
        return req_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)
