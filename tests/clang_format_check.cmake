# Fails when any source file differs from .clang-format.
file(GLOB_RECURSE files ${ROOT}/include/*.hpp ${ROOT}/include/*.cuh ${ROOT}/tests/*.cpp
     ${ROOT}/tests/*.hpp ${ROOT}/examples/*.cpp ${ROOT}/examples/*.hpp ${ROOT}/bench/*.cpp
     ${ROOT}/bench/*.cu ${ROOT}/tests/*.cu)
execute_process(COMMAND ${CLANG_FORMAT} --dry-run --Werror ${files} RESULT_VARIABLE result
                ERROR_VARIABLE errors)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "clang-format: files differ from .clang-format (run clang-format -i):\n${errors}")
endif()
list(LENGTH files count)
message(STATUS "clang-format: ${count} files clean")
