"""Alembic environment for memorm: see :func:`memorm.migrate.run_env`."""

from alembic import context

from memorm.migrate import run_env

run_env(context)
