"""The base of memorm's tables, and how their row objects are built fast.

* `metadata` (with a naming convention, so constraint
  names are stable across engines and migrations) and `MemormModel`, the
  base every table subclasses;
* `Row`, the columns most tables start with, whose constructor builds a row
  in one call (`_RowType`), with the ORM's state made on its first ask
  (`_LazyState`);
* `hydrate` and `hydrate_all`, which build model objects from rows read by
  memorm's own statements, as the ORM loads them, at a fraction of its cost.

The tables themselves are in `memorm.models` and `memorm.graph_models`.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import instrumentation, registry
from sqlmodel import Field, SQLModel
from sqlmodel.main import SQLModelMetaclass

from memorm.ids import uuid7
from memorm.tenancy import DEFAULT_TENANT, TENANT_SETTING
from memorm.types import JSONType, UTCDateTime, UUIDType, utcnow

__all__ = [
    "CurrentTenant",
    "MemormModel",
    "Row",
    "agent_key",
    "empty_dict",
    "hydrate",
    "hydrate_all",
    "keep_fast_init",
    "metadata",
    "new_id",
    "now",
    "tenant_field",
]

_STATE = instrumentation.ClassManager.STATE_ATTR  # "_sa_instance_state"

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)
"""The SQLAlchemy `MetaData` of memorm's tables (alembic's `target_metadata`).

Its naming convention keeps constraint and index names stable across engines
and migrations.
"""


class MemormModel(SQLModel, registry=registry(metadata=metadata)):
    """Base of memorm's tables; subclass it to add tables to memorm's metadata."""

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            # The ORM asks every new object for its state (`hasattr`) before it
            # has one; pydantic's `__getattr__` would look through its private
            # attributes and format an error first: a third of `Message()`.
            if name == _STATE:
                raise AttributeError(name)
            return super().__getattr__(name)


class CurrentTenant(sa.sql.functions.FunctionElement[str]):
    """The `tenant` column's server default: on Postgres the unit of work's tenant.

    That is the transaction-local setting `memorm.tenant` which row-level
    security checks too, so a raw `INSERT` through `uow.session` lands in the
    unit of work's tenant, and one with no tenant set fails (NOT NULL).  On
    SQLite, where nothing sets it, the default tenant.
    """

    type = sa.Text()
    name = "memorm_current_tenant"
    inherit_cache = True


@compiles(CurrentTenant, "postgresql")
def _current_tenant_postgres(element: CurrentTenant, compiler: Any, **kw: Any) -> str:
    return f"current_setting('{TENANT_SETTING}', true)"


@compiles(CurrentTenant)
def _current_tenant(element: CurrentTenant, compiler: Any, **kw: Any) -> str:
    return f"'{DEFAULT_TENANT}'"


def tenant_field() -> Any:
    """A table's `tenant` key column: the row's owner, set by memorm from the unit of work.

    No client-side default: a raw INSERT that names no tenant gets the
    server's (`CurrentTenant`), the unit of work's tenant on Postgres.
    """
    return Field(
        default=DEFAULT_TENANT,
        primary_key=True,
        sa_type=sa.Text,
        sa_column_kwargs={"server_default": CurrentTenant(), "default": None},
    )


def _factory(make: Callable[[], Any]) -> Callable[[], Any]:
    """A default factory whose signature pydantic need not work out.

    pydantic asks every factory's signature (does it take the validated
    data?) each time it builds a row: three `inspect.signature` calls, about
    a third of building a `Message`.  A precomputed `__signature__` answers
    at once.
    """

    def factory() -> Any:
        return make()

    factory.__signature__ = inspect.Signature()  # type: ignore[attr-defined]
    factory.__qualname__ = factory.__name__ = getattr(make, "__name__", "factory")
    factory.__wrapped__ = make  # type: ignore[attr-defined]  # what `Row`'s constructor calls
    return factory


new_id = _factory(uuid7)
now = _factory(utcnow)
empty_dict = _factory(dict)


class RowType(SQLModelMetaclass):
    """The metaclass of memorm's rows: `Message(...)` builds the row in one call.

    Calling a class runs its `__new__` (SQLModel's: pydantic's private slots)
    and then its `__init__`, each a Python frame taking the keyword arguments
    anew: about 40% of building a `Message`.  This `__call__` does both in
    one, what `Row.__init__` does, unless the ORM has `init` listeners
    besides its own: those get the ORM's order, through `__init__`.
    """

    if not TYPE_CHECKING:  # to type checkers, calling a table is calling its `__init__`

        def __call__(cls, /, **data: Any) -> Any:
            plan = _PLANS.get(cls) or _plan(cls)
            manager = plan.manager
            if manager is not None:
                manager.mapper._check_configure()  # what the ORM's own `init` listener does
                if len(manager.dispatch.init) > 1:
                    return super().__call__(**data)
            made = _new_object(cls)
            _set_slot(made, "__pydantic_extra__", None)
            _set_slot(made, "__pydantic_private__", None)
            _fill(made, plan, data)
            return made


class Row(MemormModel, metaclass=RowType):
    """Columns every table has: its tenant, a UUIDv7 id, UTC timestamps and a JSON `meta` dict.

    The primary key is `(tenant, id)`: an id another tenant holds never
    conflicts, so creating a row never tells whether it exists elsewhere.
    """

    # The owner of the row, set by memorm from the unit of work (docs/tenancy.md).
    tenant: str = tenant_field()
    id: uuid.UUID = Field(default_factory=new_id, primary_key=True, sa_type=UUIDType)
    created_at: datetime = Field(default_factory=now, sa_type=UTCDateTime, nullable=False)
    updated_at: datetime = Field(default_factory=now, sa_type=UTCDateTime, nullable=False)
    meta: dict[str, Any] = Field(default_factory=empty_dict, sa_type=JSONType, nullable=False)

    def __init__(self, **data: Any) -> None:
        """A new row: the given fields, the rest from their defaults (no validation, as SQLModel tables).

        What SQLModel's constructor does for a table, without its per-field
        trips through pydantic's and the ORM's `__setattr__` (about 20 us
        each): the values go straight into the instance's `__dict__`, where
        the ORM reads a new object's values on insert.  Names that are not
        fields are ignored, as SQLModel ignores them.

        The ORM's state is made when the ORM first asks for it (`_LazyState`);
        the ORM's `init` event still reaches whoever listens for it.
        """
        plan = _PLANS.get(type(self)) or _plan(type(self))
        manager = plan.manager
        if manager is None:  # a subclass the ORM does not map: a plain object
            _fill(self, plan, data)
            return
        manager.mapper._check_configure()  # what the ORM's own `init` listener does
        if len(manager.dispatch.init) > 1:  # others listen too: the ORM's way, state first
            _init_with_events(self, manager, plan, data)
        else:
            _fill(self, plan, data)

    def __copy__(self) -> Any:
        """A shallow copy (`copy.copy`, `model_copy`); both objects' id then counts as given.

        Two objects share one id now, so neither is taken for a new row
        whose memorm-made id needs no check when stored
        (`memorm.repositories.id_claims.chose_id`).
        """
        made = super().__copy__()
        _id_shared(self, made)
        return made

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Any:
        """A deep copy (`copy.deepcopy`, `model_copy(deep=True)`); its id counts as given, as `__copy__`'s."""
        made = super().__deepcopy__(memo)
        _id_shared(self, made)
        return made


def _id_shared(*rows: Row) -> None:
    for row in rows:
        row.__pydantic_fields_set__.add("id")


class _LazyState:
    """Where the ORM finds a row object's state: made on the ORM's first ask.

    The ORM keeps each mapped object's `InstanceState` in its `__dict__`
    under `_sa_instance_state`, and makes it when the object is built.  It
    is five objects the garbage collector tracks, the most of any part of a
    row object, and the rows memorm returns rarely meet the ORM: a bulk
    append's thousands of `Message` objects made the collector run eight
    times as often as the raw driver's rows did.  A non-data descriptor
    answers instead, until the first ask stores the state in `__dict__`,
    where later asks find it without coming here.
    """

    def __get__(self, instance: object, owner: type[Any] | None = None) -> Any:
        manager = None if instance is None else _manager(type(instance))
        if manager is None:
            raise AttributeError(_STATE)
        state = manager._state_constructor(instance, manager)
        return instance.__dict__.setdefault(_STATE, state)  # a racing first ask: one state wins


type.__setattr__(Row, _STATE, _LazyState())  # past pydantic, which would take it for a private attribute


def agent_key(table: str) -> sa.ForeignKeyConstraint:
    """`(tenant, agent_id)` -> the agent, in the same tenant; deleting the agent deletes the row."""
    return sa.ForeignKeyConstraint(
        ["tenant", "agent_id"],
        ["agents.tenant", "agents.id"],
        name=f"fk_{table}_agent_id_agents",
        ondelete="CASCADE",
    )


M = TypeVar("M", bound=MemormModel)


def hydrate(model: type[M], values: dict[str, Any]) -> M:
    """A `model` instance holding `values`, built the way the ORM loads rows.

    About 30x cheaper than `model(**values)`, which runs every default
    factory and instrumented `setattr`; for rows memorm has already checked.
    What the ORM's `new_instance` and SQLModel's `__new__` would do, inlined:
    pydantic's three private slots and the values, written directly.

    `values` becomes the instance's `__dict__`: the caller hands it over and
    keeps no other use of it.  Memorm's rows (`Row`) make their ORM state
    when the ORM asks (`_LazyState`); other tables get it here.
    """
    instance: M = _new_object(model)
    _set_slot(instance, "__dict__", values)
    _set_slot(instance, "__pydantic_fields_set__", set())
    _set_slot(instance, "__pydantic_extra__", None)
    _set_slot(instance, "__pydantic_private__", None)
    if not issubclass(model, Row):
        manager = _manager(model)
        if manager is not None:
            values[_STATE] = manager._state_constructor(instance, manager)
    return instance


def hydrate_all(
    model: type[M], names: Sequence[str], rows: Iterable[Sequence[Any]], *, offset: int = 0
) -> list[M]:
    """`hydrate` of many rows: each row's values from `offset` on, in `names` order.

    One pass, without a call per row: a window's fifty messages are built
    in the time about thirty-five `hydrate` calls take.
    """
    if not issubclass(model, Row):
        return [hydrate(model, dict(zip(names, row[offset:], strict=True))) for row in rows]
    new, put = _new_object, _set_slot
    made: list[M] = []
    for row in rows:
        instance = new(model)
        put(instance, "__dict__", dict(zip(names, row[offset:] if offset else row, strict=True)))
        put(instance, "__pydantic_fields_set__", set())
        put(instance, "__pydantic_extra__", None)
        put(instance, "__pydantic_private__", None)
        made.append(instance)
    return made


_MANAGERS: dict[type[Any], Any] = {}


def _manager(model: type[Any]) -> Any:
    """The ORM's `ClassManager` of `model` (None for a class it does not map), looked up once."""
    try:
        return _MANAGERS[model]
    except KeyError:
        found = _MANAGERS[model] = instrumentation.opt_manager_of_class(model)
        return found


@dataclass(frozen=True)
class _ConstructionPlan:
    """How `Row.__init__` fills a table's fields: defaults, names, and factories to call."""

    defaults: dict[str, Any]  # every field in order: its default (None where a factory makes it)
    names: frozenset[str]
    factories: tuple[tuple[str, Callable[[], Any]], ...]
    manager: Any  # the ORM's ClassManager; None for a subclass it does not map


_PLANS: dict[type[Any], _ConstructionPlan] = {}


def _plan(model: type[MemormModel]) -> _ConstructionPlan:
    """The `_ConstructionPlan` of a table, made on its first construction."""
    if model.__pydantic_post_init__ or any(field.alias for field in model.model_fields.values()):
        raise TypeError(f"{model.__name__}: Row's constructor supports no aliases or post-init hooks")
    defaults: dict[str, Any] = {}
    factories: list[tuple[str, Callable[[], Any]]] = []
    for name, field in model.model_fields.items():
        factory = cast("Callable[[], Any] | None", field.default_factory)  # memorm's take no data
        factory = getattr(factory, "__wrapped__", factory)  # `_factory`'s: the call itself
        default = None if factory is not None or field.is_required() else field.default
        if not isinstance(default, (str, int, float, bool, type(None))):
            raise TypeError(f"{model.__name__}.{name}: a mutable default needs a default_factory")
        defaults[name] = default
        if factory is not None:
            factories.append((name, factory))
    _PLANS[model] = found = _ConstructionPlan(
        defaults, frozenset(defaults), tuple(factories), _manager(model)
    )
    return found


def _fill(instance: Row, plan: _ConstructionPlan, data: dict[str, Any]) -> None:
    """Write a new row's fields: `data`'s, the rest from their defaults (see `Row.__init__`)."""
    values = dict(plan.defaults)  # every field, in order: the defaults, None for factories
    if plan.names.issuperset(data):
        values.update(data)
        given = set(data)
    else:
        given = {name for name in data if name in plan.names}
        values.update((name, data[name]) for name in given)
    for name, factory in plan.factories:
        if name not in given:
            values[name] = factory()
    instance.__dict__.update(values)
    _set_slot(instance, "__pydantic_fields_set__", given)


def _init_with_events(instance: Row, manager: Any, plan: _ConstructionPlan, data: dict[str, Any]) -> None:
    """`_fill`, inside the ORM's `init` and `init_failure` events (what its own `__init__` does)."""
    state = manager._state_constructor(instance, manager)
    instance.__dict__[_STATE] = state
    manager.dispatch.init(state, (), data)  # a listener may change `data`, as the ORM allows
    try:
        _fill(instance, plan, data)
    except BaseException:
        with sa.util.safe_reraise():
            manager.dispatch.init_failure(state, (), data)


_new_object = object.__new__
_set_slot = object.__setattr__


def keep_fast_init(models: Iterable[type[Row]]) -> None:
    """Give each mapped table `Row`'s constructor back, once the ORM has mapped it.

    The ORM wrapped each table's `__init__` in its own, which makes the state
    first; `Row.__init__` does the same work with the state made on demand.
    """
    for model in models:
        type.__setattr__(model, "__init__", Row.__init__)
