-- A syntax error on line 5.
return {
    name = "broken",
    from = "#",
    select = function(msg) return { x = } end,
}
