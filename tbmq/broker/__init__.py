"""The broker: protocol, sessions, router, trie, retained messages."""
