"""The plugin manager: the built-in plugins first, then the entry points of
the group ``tbmq`` (third-party plugins), then the config: ``plugins:
{name: {enabled: false}}`` disables a plugin by name, the rest of its section
is read by the plugin from the config :func:`~tbmq.hookspecs.tbmq_configure`
(a historic hook) hands it, and authentication
providers not listed in ``auth.providers`` are switched off.
"""

from __future__ import annotations

from typing import Any, Sequence

import pluggy
from twisted.logger import Logger

from tbmq import hookspecs
from tbmq.log import OBSERVER as LOG_OBSERVER

log = Logger(observer=LOG_OBSERVER)

#: the names of the authentication provider plugins ``auth.providers`` selects
AUTH_PROVIDERS = ("basic", "x509", "scram", "jwt", "http")

#: the factory hooks (:mod:`tbmq.hookspecs`): a plugin that implements them
#: serves a config only when one of them gave it a backend (an
#: integration's target, ``tbmq_integration_target``, is built after the
#: broker and logged by :mod:`tbmq.integrations`)
FACTORY_HOOKS = ("tbmq_message_bus", "tbmq_retained_store", "tbmq_device_message_store",
                 "tbmq_credential_store", "tbmq_integration_target")

#: what a decision hook makes a plugin do, for the log
_DECISIONS = {"tbmq_authenticate": "authentication",
              "tbmq_authentication_scope": "authentication",
              "tbmq_authorize_publish": "authorization",
              "tbmq_authorize_subscribe": "authorization"}


def make_plugin_manager(config, load_entry_points: bool = True) -> pluggy.PluginManager:
    """Build the plugin manager for ``config``.

    :param config: the :class:`tbmq.config.Config`.
    :param load_entry_points: also load the ``tbmq`` entry-point group.
    :returns: a :class:`pluggy.PluginManager` with every plugin not
        disabled registered and configured; the log names each disabled
        one and why (``plugin disabled: x509 (not in auth.providers)``);
        :func:`log_plugins` tells what the others serve once the broker
        has its backends.
    """
    from tbmq import embedded

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    disabled = {name: f"plugins.{name}.enabled: false"
                for name, settings in dict(config.plugins).items()
                if hasattr(settings, "get") and settings.get("enabled") is False}
    for name in AUTH_PROVIDERS:
        if name not in config.auth.providers:
            disabled.setdefault(name, "not in auth.providers")
    for name in disabled:
        pm.set_blocked(name)
    for name, plugin in embedded.builtin_plugins(config):
        if not pm.is_blocked(name):
            pm.register(plugin, name=name)
    if load_entry_points:
        pm.load_setuptools_entrypoints(hookspecs.PROJECT)
    pm.hook.tbmq_configure.call_historic(kwargs={"config": config})
    for name in sorted(disabled):
        log.info("plugin disabled: {name} ({why})", name=name, why=disabled[name])
    return pm


def first_result(hook: pluggy.HookCaller, **kwargs: Any) -> tuple[Any, str | None]:
    """Call a factory hook (``firstresult``) as pluggy does, and tell which
    plugin answered.

    :param hook: ``pm.hook.<name>``.
    :param kwargs: the hook's arguments.
    :returns: ``(the first result that is not None, the name of the plugin
        that gave it)``, ``(None, None)`` when none did; with a hook wrapper
        in the way, pluggy's own call and None for the name.
    """
    impls = ordered_impls(hook)
    if any(impl.hookwrapper or impl.wrapper for impl in impls):
        return hook(**kwargs), None
    for impl in impls:
        result = impl.function(*[kwargs[name] for name in impl.argnames])
        if result is not None:
            return result, impl.plugin_name
    return None, None


def log_plugins(pm: pluggy.PluginManager, provided: dict[str, list[str]]) -> None:
    """Log what each registered plugin serves for this config:
    ``plugin active: embedded (bus memory; retained store sqlite)``,
    ``plugin active: basic (authentication)``, or ``plugin loaded, unused:
    kafka (provides nothing this config uses)`` for a plugin whose only
    hooks are factories that gave no backend (a cluster backend on the
    embedded node).

    :param pm: the plugin manager.
    :param provided: plugin name → the backends its factory hooks gave
        (``["bus memory"]``).
    """
    for name, plugin in pm.list_name_plugin():
        if plugin is None:  # blocked: logged as disabled
            continue
        roles = list(provided.get(name, ()))
        hooks = [caller.name for caller in pm.get_hookcallers(plugin) or ()]
        for hook in hooks:
            role = _DECISIONS.get(hook)
            if role is not None and role not in roles:
                roles.append(role)
        notified = sorted(hook[len("tbmq_"):] for hook in hooks
                          if hook not in _DECISIONS and hook not in FACTORY_HOOKS
                          and hook != "tbmq_configure")
        if notified:
            roles.append("notified of " + ", ".join(notified))
        if roles:
            log.info("plugin active: {name} ({roles})", name=name, roles="; ".join(roles))
        else:
            log.info("plugin loaded, unused: {name} (provides nothing this config uses)",
                     name=name)


def ordered_impls(hook: pluggy.HookCaller, first: Sequence[str] = ()) -> list:
    """The implementations of ``hook`` in the order to ask them: those named
    in ``first`` in that order, then the others in pluggy's call order
    (``trylast`` ones at the end)."""
    impls = list(reversed(hook.get_hookimpls()))
    rank = {name: i for i, name in enumerate(first)}
    return sorted(impls, key=lambda impl: (
        bool(impl.trylast), rank.get(impl.plugin_name, len(rank))))
