"""Limit/offset pagination with bounds: a limit above ``max_limit`` is clamped, a malformed one is a 400."""
from __future__ import annotations

import re

from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

from core.errors import MnesioError

# PostgreSQL's LIMIT and OFFSET are bigints: anything past this overflows (DataError) instead of paging.
MAX_OFFSET = 2**63 - 1
_DIGITS = re.compile(r"[0-9]+")


def _shown(raw: str) -> str:
    """The received value for an error message, cut short (a query value can be megabytes)."""
    return repr(raw if len(raw) <= 40 else raw[:40] + "...")


def _non_negative(raw: str, *, field: str, ceiling: int) -> int:
    """Parse ``raw`` as a non-negative integer, clamped to ``ceiling``; raise naming ``field`` otherwise."""
    text = raw.strip()
    if not _DIGITS.fullmatch(text):
        raise MnesioError(f"`{field}` has to be a non-negative integer but got {_shown(raw)}", extra={"field": field})
    # more digits than the ceiling has is above it: no int() of a 5,000-digit string (Python refuses > 4,300)
    if len(text.lstrip("0")) > len(str(ceiling)):
        return ceiling
    return min(int(text), ceiling)


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """``?limit=&offset=`` paging that never sends PostgreSQL a number it cannot hold."""

    max_limit = 1000  # a page of memories is decrypted row by row: 1,000 is a few ms, 10**26 is a DataError

    def get_limit(self, request: Request) -> int:
        raw = request.query_params.get(self.limit_query_param)
        if raw is None:
            return self.default_limit
        limit = _non_negative(raw, field=self.limit_query_param, ceiling=self.max_limit)
        if limit == 0:
            raise MnesioError(
                f"`{self.limit_query_param}` has to be between 1 and {self.max_limit} but got 0",
                extra={"field": self.limit_query_param, "max_limit": self.max_limit},
            )
        return limit

    def get_offset(self, request: Request) -> int:
        raw = request.query_params.get(self.offset_query_param)
        if raw is None:
            return 0
        # an offset past the end is an empty page (paginate_queryset returns [] without querying)
        return _non_negative(raw, field=self.offset_query_param, ceiling=MAX_OFFSET - self.max_limit)
