"""The registry of named batch policies: the ones `tmplkit prefill --policy` offers and `--policy
all` runs, in this order, listed here once (no module registers itself by being imported).

    >>> get_policy("gated").name
    'gated'
    >>> sorted(POLICIES)
    ['divergence-aware', 'every-user-start', 'gated', 'none']

To add one, subclass `BatchPolicy` and register an instance: `POLICIES.register(Mine())`; a name
registered already is refused.
"""

from __future__ import annotations

from ..errors import InputError
from ._divergence_aware import DivergenceAware
from ._policies import BatchPolicy, EveryUserStart, Gated, NoBreaks

__all__ = ["POLICIES", "PolicyRegistry", "get_policy"]


class PolicyRegistry(dict[str, BatchPolicy]):
    """Policies by name, in registration order; a name is registered once.

    >>> PolicyRegistry(NoBreaks()).register(NoBreaks())
    Traceback (most recent call last):
    ...
    tmplkit.errors.InputError: a batch policy named 'none' is registered already
    """

    def __init__(self, *policies: BatchPolicy):
        super().__init__()
        for policy in policies:
            self.register(policy)

    def register(self, policy: BatchPolicy) -> BatchPolicy:
        """Add `policy` under its name; returns it."""
        self[policy.name] = policy
        return policy

    def __setitem__(self, name: str, policy: BatchPolicy) -> None:
        if name in self:
            raise InputError(f"a batch policy named '{name}' is registered already")
        super().__setitem__(name, policy)


POLICIES = PolicyRegistry(NoBreaks(), EveryUserStart(), Gated(), DivergenceAware())


def get_policy(policy: str | BatchPolicy) -> BatchPolicy:
    """A policy by name (or the policy itself)."""
    if isinstance(policy, BatchPolicy):
        return policy
    try:
        return POLICIES[policy]
    except KeyError:
        raise InputError(f"unknown batch policy '{policy}'; known: {', '.join(POLICIES)}") from None
