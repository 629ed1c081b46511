"""Models as graphs of operators: the IR importers produce, and the compiler that fuses them
into tasks and runs them."""

from autosched.graph.graph import Graph, Node, ValueInfo

__all__ = ["Graph", "Node", "ValueInfo"]
