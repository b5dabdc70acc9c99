"""Helpers with no Django and no app imports: the lowest layer."""
