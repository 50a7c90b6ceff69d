"""pydantic models with the shapes pydantic writes for everyday fields, for the JSON-schema tests
(tests/unit/test_json_pydantic.py) and the served one (tests/mpi/test_tools_auto_mpi.py)."""

from __future__ import annotations

import enum
from datetime import datetime, timedelta
from ipaddress import IPv6Address
from pathlib import Path
from typing import Literal

from pydantic import UUID4, AnyUrl, BaseModel, Field, HttpUrl, IPvAnyAddress, SecretStr


class Color(str, enum.Enum):
    red = "red"
    green = "green"


class Cat(BaseModel):
    pet_type: Literal["cat"]
    meows: int = Field(ge=0, le=10)


class Dog(BaseModel):
    pet_type: Literal["dog"]
    bark: float = Field(gt=-1.5, lt=2)


class Record(BaseModel):
    """A float in bounds, dict[str, int], a tuple, a discriminated union, an enum, Optional, lists,
    a long string, URLs."""

    score: float = Field(ge=0, le=1)
    counts: dict[str, int]
    point: tuple[int, str]
    pet: Cat | Dog = Field(discriminator="pet_type")
    color: Color = Color.red
    note: str | None = Field(default=None, max_length=4)
    tags: list[str] = Field(default_factory=list, max_length=2)
    ids: list[int] = Field(default_factory=list)  # (no bounds)
    votes: dict[str, bool] = Field(default_factory=lambda: {"x": True}, min_length=1, max_length=2)
    summary: str = Field(default="", max_length=300)  # (a long maxLength: counted on the stack)
    site: AnyUrl | None = None
    home: HttpUrl | None = None  # (format uri, maxLength 2083; pydantic also wants http or https)
    price: float = Field(default=0, ge=0, multiple_of=0.25)
    step: int = Field(default=0, multiple_of=5)


class Review(BaseModel):
    """No free string: every answer sampled under its grammar ends within a few hundred tokens."""

    stars: int = Field(ge=1, le=5)
    confidence: float = Field(ge=0, le=1)
    point: tuple[int, bool]
    pet: Cat | Dog = Field(discriminator="pet_type")


class Tree(BaseModel):
    """Recursive (a $ref to itself): read with the grammar's stack."""

    name: Literal["a", "b"]
    kids: list[Tree] = Field(default_factory=list, max_length=3)
    next: Tree | None = None


class Kinds(BaseModel):
    """pydantic's types whose schemas are string formats (uuid4, date-time, duration, ipvanyaddress,
    ipv6, password, binary, path)."""

    id: UUID4
    at: datetime
    took: timedelta
    host: IPvAnyAddress
    v6: IPv6Address
    secret: SecretStr
    blob: bytes
    where: Path
