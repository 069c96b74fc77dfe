"""A researcher's own environments, for the tests: registered nowhere until imported.

``toyenvs.corridor`` defines them; importing ``toyenvs.registered`` registers ``Corridor-v0``
with Gymnasium (the ``module:id`` form); ``make_corridor`` is an entry point.
"""
