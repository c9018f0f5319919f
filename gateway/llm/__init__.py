"""Generative models behind the gateway: the OpenAI API's routes (request checks, errors in
OpenAI's shape), the relay of each answer to and from OpenAI-compatible engines, and the choice
of engine replica from the engines' own load metrics."""
