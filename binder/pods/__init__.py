"""The pod controller: a pending pod's turn (place, bind or say why not), and the binder's side of a
dead agent."""
