"""The plugin manager: the built-in plugins first, then the entry points of
the group ``tbmq`` (third-party plugins), then the config's ``plugins``
section, which disables plugins by name (``plugins: {name: {enabled: false}}``).
"""

from __future__ import annotations

from typing import Any

import pluggy
from twisted.internet import defer
from twisted.logger import Logger

from tbmq import hookspecs

log = Logger()


def make_plugin_manager(config, load_entry_points: bool = True) -> pluggy.PluginManager:
    """Build the plugin manager for ``config``.

    :param config: the :class:`tbmq.config.Config`.
    :param load_entry_points: also load the ``tbmq`` entry-point group.
    :returns: a :class:`pluggy.PluginManager` with every active plugin
        registered; the log names each one.
    """
    from tbmq import embedded

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name, plugin in embedded.builtin_plugins(config):
        pm.register(plugin, name=name)
    if load_entry_points:
        pm.load_setuptools_entrypoints(hookspecs.PROJECT)
    for name, settings in dict(config.plugins).items():
        if isinstance(settings, dict) and settings.get("enabled") is False:
            plugin = pm.get_plugin(name)
            if plugin is not None:
                pm.unregister(plugin)
                pm.set_blocked(name)
    for name, _ in pm.list_name_plugin():
        log.info("plugin active: {name}", name=name)
    return pm


def call_decision(hook: pluggy.HookCaller, **kwargs: Any) -> defer.Deferred:
    """Ask each implementation of a decision hook in turn, in pluggy's call
    order, until one answers something other than None.

    Implementations may return Deferreds; the next one is only asked once the
    previous one's Deferred fired with None.

    :returns: a Deferred firing with the first answer, or None when every
        plugin passed.
    """
    impls = list(reversed(hook.get_hookimpls()))

    def ask(index: int):
        while index < len(impls):
            impl = impls[index]
            index += 1
            args = [kwargs[name] for name in impl.argnames]
            result = impl.function(*args)
            if isinstance(result, defer.Deferred):
                return result.addCallback(
                    lambda answer, i=index: answer if answer is not None else ask(i))
            if result is not None:
                return result
        return None

    return defer.maybeDeferred(ask, 0)
