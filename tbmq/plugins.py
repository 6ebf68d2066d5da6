"""The plugin manager: the built-in plugins first, then the entry points of
the group ``tbmq`` (third-party plugins), then the config: ``plugins:
{name: {enabled: false}}`` disables a plugin by name, the rest of its section
is read by the plugin from the config :func:`~tbmq.hookspecs.tbmq_configure`
(a historic hook) hands it, and authentication
providers not listed in ``auth.providers`` are switched off.
"""

from __future__ import annotations

from typing import Sequence

import pluggy
from twisted.logger import Logger

from tbmq import hookspecs
from tbmq.log import OBSERVER as LOG_OBSERVER

log = Logger(observer=LOG_OBSERVER)

#: the names of the authentication provider plugins ``auth.providers`` selects
AUTH_PROVIDERS = ("basic", "x509", "scram", "jwt")


def make_plugin_manager(config, load_entry_points: bool = True) -> pluggy.PluginManager:
    """Build the plugin manager for ``config``.

    :param config: the :class:`tbmq.config.Config`.
    :param load_entry_points: also load the ``tbmq`` entry-point group.
    :returns: a :class:`pluggy.PluginManager` with every active plugin
        registered and configured; the log names each one.
    """
    from tbmq import embedded

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    disabled = {name for name, settings in dict(config.plugins).items()
                if hasattr(settings, "get") and settings.get("enabled") is False}
    disabled.update(name for name in AUTH_PROVIDERS if name not in config.auth.providers)
    for name in disabled:
        pm.set_blocked(name)
    for name, plugin in embedded.builtin_plugins(config):
        if not pm.is_blocked(name):
            pm.register(plugin, name=name)
    if load_entry_points:
        pm.load_setuptools_entrypoints(hookspecs.PROJECT)
    pm.hook.tbmq_configure.call_historic(kwargs={"config": config})
    for name, _ in pm.list_name_plugin():
        log.info("plugin active: {name}", name=name)
    return pm


def ordered_impls(hook: pluggy.HookCaller, first: Sequence[str] = ()) -> list:
    """The implementations of ``hook`` in the order to ask them: those named
    in ``first`` in that order, then the others in pluggy's call order
    (``trylast`` ones at the end)."""
    impls = list(reversed(hook.get_hookimpls()))
    rank = {name: i for i, name in enumerate(first)}
    return sorted(impls, key=lambda impl: (
        bool(impl.trylast), rank.get(impl.plugin_name, len(rank))))
