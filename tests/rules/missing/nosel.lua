return {
    name = "nosel",
    from = "a/b",
    to = {},
}
