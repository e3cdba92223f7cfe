# The rtd.conf an installed rtd reads: etc/rtd.conf with data_dir set to the state directory
# (the checkout's says "../data", its data/). Run by CMakeLists.txt as
#   cmake -DIN=etc/rtd.conf -DOUT=... -DSTATE_DIR=/var/lib/rt -P installed_conf.cmake
# The value keeps its column, so the comments after it stay aligned; a file whose data_dir
# line is not where this expects it fails the build rather than ship "../data".
file(READ "${IN}" conf)
string(REGEX MATCH "\ndata_dir = \"[^\"]*\" *" line "${conf}")
if(NOT line)
    message(FATAL_ERROR "${IN}: no `data_dir = \"...\"` line to set to ${STATE_DIR}")
endif()
string(LENGTH "${line}" width)
set(new "\ndata_dir = \"${STATE_DIR}\"")
string(LENGTH "${new}" used)
while(used LESS width)
    string(APPEND new " ")
    math(EXPR used "${used} + 1")
endwhile()
if(used EQUAL width)
    string(REPLACE "${line}" "${new}" conf "${conf}")
else() # the new value is longer than the old one and its padding: one space after it
    string(REPLACE "${line}" "${new} " conf "${conf}")
endif()
file(WRITE "${OUT}" "${conf}")
