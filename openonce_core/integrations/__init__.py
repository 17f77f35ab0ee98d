"""Adapters for agent frameworks that own where a tool call's scope comes from and how a
call waits for a person.

* :mod:`openonce_core.integrations.langgraph` — ``effect_tool``: the dedup scope is the
  graph's ``thread_id``; a call that needs approval pauses the graph with ``interrupt()``.
* :mod:`openonce_core.integrations.openai_agents` — ``effect_function_tool`` and
  ``OpenOnceRunContext``: the scope comes from the run context; approvals and unknown
  outcomes become structured JSON tool outputs the model acts on.

Each adapter imports its framework, so each is an install extra
(``pip install openonce[langgraph]``, ``openonce[openai-agents]``). Importing this package
imports no framework. In a bare SDK tool loop (OpenAI, Anthropic) you execute the tool
calls yourself and ``@oo.effect`` is the whole integration: see ``examples/``.
"""
