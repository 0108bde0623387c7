# Compiles SOURCE and passes when the compiler fails with EXPECT in its message.
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -I${INCLUDE} ${SOURCE}
                RESULT_VARIABLE result ERROR_VARIABLE errors OUTPUT_VARIABLE output)
if(result EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but must not")
endif()
string(FIND "${errors}${output}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the compile error does not name ${EXPECT}:\n${errors}")
endif()
message(STATUS "compile error names ${EXPECT}, as it should")
