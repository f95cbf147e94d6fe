"""Who may do what: API keys, tenants, token keys, and the tokens and links signed with them."""
