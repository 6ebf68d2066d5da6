"""``Hooks.authenticate``: providers asked in order, their implementations
read from pluggy once per change of the plugin set and called without
pluggy's per-call machinery, answers given at once passed on at once."""

from __future__ import annotations

import pluggy
from twisted.internet import defer

from tbmq import hookspecs
from tbmq.auth import AuthRequest, AuthResult
from tbmq.broker.hooks import Hooks
from tbmq.hookspecs import hookimpl


class Provider:
    def __init__(self, answer):
        self.answer = answer
        self.asked = 0

    @hookimpl
    def tbmq_authenticate(self, request):
        self.asked += 1
        return self.answer


def manager(**plugins) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name, plugin in plugins.items():
        pm.register(plugin, name=name)
    return pm


def request() -> AuthRequest:
    return AuthRequest(client_id="c", username=None, password=None, protocol_level=4)


def test_an_answer_given_at_once_is_passed_on_at_once():
    yes = AuthResult(True, provider="b")
    hooks = Hooks(manager(a=Provider(None), b=Provider(yes)), providers=("a", "b"))
    assert hooks.authenticate(request()) == (yes, "b")
    assert Hooks(manager(a=Provider(None)), ("a",)).authenticate(request()) == (None, None)


def test_a_deferred_answer_hands_over_to_the_next_provider_in_order():
    later = defer.Deferred()
    yes = AuthResult(True, provider="c")
    first, third = Provider(later), Provider(yes)
    hooks = Hooks(manager(c=third, a=first, b=Provider(None)), providers=("a", "b", "c"))
    answers = []
    d = hooks.authenticate(request())
    assert isinstance(d, defer.Deferred)
    d.addCallback(answers.append)
    assert answers == [] and third.asked == 0
    later.callback(None)  # a passed: b passes at once, c answers
    assert answers == [(yes, "c")] and third.asked == 1
    only = hooks.authenticate(request(), provider="a")
    assert only == (None, None) or isinstance(only, defer.Deferred)


def test_provider_asks_only_that_plugin():
    a, b = Provider(AuthResult(True, provider="a")), Provider(AuthResult(True, provider="b"))
    hooks = Hooks(manager(a=a, b=b), providers=("a", "b"))
    assert hooks.authenticate(request(), provider="b")[1] == "b"
    assert (a.asked, b.asked) == (0, 1)


def test_a_failing_provider_gives_a_failed_deferred():
    class Broken:
        @hookimpl
        def tbmq_authenticate(self, request):
            raise ValueError("boom")

    d = Hooks(manager(x=Broken()), ("x",)).authenticate(request())
    failures = []
    d.addErrback(failures.append)
    assert failures and failures[0].check(ValueError)


def test_plain_providers_do_not_go_through_pluggy_per_call(monkeypatch):
    hooks = Hooks(manager(a=Provider(None), b=Provider(AuthResult(True))), ("a", "b"))
    calls = []
    real = pluggy.PluginManager._hookexec

    def counting(self, *args, **kwargs):
        calls.append(args[0])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pluggy.PluginManager, "_hookexec", counting)
    assert hooks.authenticate(request())[1] == "b"
    assert calls == []


def test_a_provider_with_a_wrapper_still_goes_through_pluggy():
    seen = []

    class Wrapped:
        @hookimpl(wrapper=True)
        def tbmq_authenticate(self, request):
            seen.append("before")
            result = yield
            seen.append("after")
            return result

    pm = manager(w=Wrapped(), p=Provider(AuthResult(True, provider="p")))
    hooks = Hooks(pm, ("w", "p"))
    assert hooks.authenticate(request())[1] == "p"
    assert seen == ["before", "after"]


def test_refresh_takes_a_plugin_registered_at_run_time():
    pm = manager(a=Provider(None))
    hooks = Hooks(pm, ("a", "late"))
    assert hooks.authenticate(request()) == (None, None)
    pm.register(Provider(AuthResult(True, provider="late")), name="late")
    hooks.refresh()
    assert hooks.authenticate(request())[1] == "late"


def test_an_implementation_without_the_argument_is_called_without_it():
    class NoArgs:
        @hookimpl
        def tbmq_authenticate(self):
            return AuthResult(True, provider="n")

    hooks = Hooks(manager(n=NoArgs()), ("n",))
    assert hooks.authenticate(request()) == (AuthResult(True, provider="n"), "n")


class Scoped(Provider):
    """A provider that tells its scope (``tbmq_authentication_scope``)."""

    def __init__(self, answer, scope):
        super().__init__(answer)
        self.scope = scope
        self.configs = []

    @hookimpl
    def tbmq_authentication_scope(self, config):
        self.configs.append(config)
        return self.scope


def test_a_provider_is_asked_only_the_requests_of_the_scope_it_told():
    from tbmq.auth import AuthScope

    certificate = Scoped(AuthResult(True, provider="x"), AuthScope(needs=frozenset({"certificate_chain"})))
    token = Scoped(None, AuthScope(needs=frozenset({"password"})))
    scram = Scoped(AuthResult(True, provider="s"), AuthScope(plain=False, methods=frozenset({"M"})))
    anyone = Provider(AuthResult(True, provider="z"))  # tells nothing: asked every time
    config = object()
    hooks = Hooks(manager(x=certificate, j=token, s=scram, z=anyone), ("x", "j", "s", "z"), config)
    assert certificate.configs == [config] and token.configs == [config]  # once, not per request
    assert hooks.authenticate(request())[1] == "z"
    assert (certificate.asked, token.asked, scram.asked, anyone.asked) == (0, 0, 0, 1)
    with_password = AuthRequest("c", None, b"secret", 4)
    assert hooks.authenticate(with_password)[1] == "z"
    assert (certificate.asked, token.asked, scram.asked) == (0, 1, 0)
    with_chain = AuthRequest("c", None, None, 4, certificate_chain=["leaf"])
    assert hooks.authenticate(with_chain)[1] == "x"
    assert (certificate.asked, token.asked, scram.asked) == (1, 1, 0)
    assert hooks.authenticate(AuthRequest("c", None, None, 5, auth_method="M"))[1] == "s"
    assert hooks.authenticate(AuthRequest("c", None, None, 5, auth_method="other"))[1] == "z"
    assert (certificate.asked, token.asked, scram.asked, anyone.asked) == (1, 1, 1, 3)
    assert certificate.configs == [config]


def test_a_provider_out_of_every_request_is_never_asked_and_a_failing_scope_asks_always():
    from tbmq.auth import NO_REQUEST

    class Failing(Provider):
        @hookimpl
        def tbmq_authentication_scope(self, config):
            raise ValueError("boom")

    never, failing = Scoped(AuthResult(True, provider="n"), NO_REQUEST), Failing(None)
    hooks = Hooks(manager(n=never, f=failing), ("n", "f"), object())
    assert hooks.authenticate(AuthRequest("c", "u", b"p", 4)) == (None, None)
    assert (never.asked, failing.asked) == (0, 1)


def test_the_built_in_providers_scopes_follow_the_configuration():
    from tbmq.config import load_config
    from tbmq.plugins import make_plugin_manager

    def asked(overrides, req):
        config = load_config(None, environ={}, overrides=overrides)
        hooks = Hooks(make_plugin_manager(config, load_entry_points=True),
                      config.auth.providers, config)
        hooks.authenticate(req)
        shape = next(iter(hooks._by_shape))
        return [name for name, _ in hooks._by_shape[shape]]

    plain = {"auth": {"credentials": "memory", "providers": ["basic", "x509", "scram", "jwt"]},
             "storage": {"backend": "memory"}}
    assert asked(plain, AuthRequest("c", None, None, 4)) == ["basic", "anonymous"]
    assert asked(plain, AuthRequest("c", "u", b"t", 4)) == ["basic", "anonymous"]  # no JWT key
    keyed = {**plain, "auth": {**plain["auth"], "jwt": {"secret": "k"}}}
    assert asked(keyed, AuthRequest("c", "u", b"t", 4)) == ["basic", "jwt", "anonymous"]
    assert asked(plain, AuthRequest("c", None, None, 4, certificate_chain=["leaf"])) == [
        "basic", "x509", "anonymous"]
    assert asked(plain, AuthRequest("c", None, None, 5, auth_method="SCRAM-SHA-256")) == ["scram"]
