return {
    name = "x",
    from = "a/b",
    select = function(msg) return { a = 1 } end,

    to = { "nosuchsink" },
}
